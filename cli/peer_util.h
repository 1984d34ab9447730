// What `bench train` and `bench generate` share to run their PyTorch peers (bench/peers/*.py):
// Debian's interpreter, finding the script, quoting for the shell and reading the peer's output.
#pragma once
#include <filesystem>
#include <optional>
#include <string>

namespace cemfrac::cli {

// The interpreter the peers run under: the one whose torch the build is for (CMake's
// CEMFRAC_PYTHON_EXECUTABLE: Debian's /usr/bin/python3 with python3-torch on the host, the venv's
// python in the pip leg), so that a peer always runs the same torch as the engine it is compared with.
#ifndef CEMFRAC_PEER_PYTHON
#define CEMFRAC_PEER_PYTHON "/usr/bin/python3"
#endif
inline constexpr const char* kPeerPython = CEMFRAC_PEER_PYTHON;

// Whether kPeerPython exists and imports torch.
bool python_with_torch();

// `given` (--peer-script) when set (it must exist), else `rel_path` under $CEMFRAC_SOURCE_DIR, the
// working directory or a folder above the executable; nullopt when none has it.
std::optional<std::filesystem::path> locate_peer(const std::string& given,
                                                 const std::string& rel_path);

// s in single quotes for /bin/sh.
std::string quote_for_shell(const std::string& s);

// stdout of `command`; throws cemfrac::Error naming `what` when it cannot start or exits non-zero.
std::string capture_stdout(const std::string& command, const std::string& what);

// capture_stdout, and `temp_file` (what the peer was handed, e.g. its weights) removed afterwards
// whether the peer succeeded or not.
std::string run_peer(const std::string& command, const std::string& what,
                     const std::string& temp_file);

}  // namespace cemfrac::cli
