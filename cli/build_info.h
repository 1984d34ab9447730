// Where the running binary came from: the git commit it was built from, read at build time by
// cmake/BuildCommit.cmake ("unknown" outside a git checkout, "<commit> + uncommitted changes" when
// the tracked files differed from it). Not the working directory's commit: a report made by an
// older binary must not claim the newer source.
#pragma once

namespace cemfrac::cli {

const char* build_commit();

}  // namespace cemfrac::cli
