// What `bench train` and `bench generate` share to run their PyTorch peers (bench/peers/*.py):
// Debian's interpreter, finding the script, quoting for the shell and reading the peer's output.
#pragma once
#include <filesystem>
#include <optional>
#include <string>

#include "cemfrac/model/model_config.h"

namespace cemfrac::cli {

// The PyTorch peers and the layer kinds each writes: the training step (bench/peers/train_step_peer.py:
// mha, CEM attention and CAttnM mixers; SwiGLU, GELU MLP, CEM MLP and Cffn FFNs) and cached
// decoding (bench/peers/decode_peer.py: mha with SwiGLU or GELU MLP).
enum class Peer { kTrainStep, kDecode };

// Why `peer` cannot model `m` ("" when it can): the first layer kind it does not write, or a
// LayerNorm without bias. The options of those kinds it does not write (cem.dlr_distance,
// cofrgenet.glu, ...) the peer refuses itself, in one line.
std::string peer_unsupported(const ModelConfig& m, Peer peer);

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
