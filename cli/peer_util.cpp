#include "cli/peer_util.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cemfrac/core/check.h"

namespace cemfrac::cli {

std::string peer_unsupported(const ModelConfig& m, Peer peer) {
  const bool train = peer == Peer::kTrainStep;
  for (int64_t l = 0; l < m.n_layers; ++l) {
    const std::string mixer = m.mixer_of(l), ffn = m.ffn_of(l);
    if (mixer != "mha" && !(train && (mixer == "cem_attention" || mixer == "cattn_m")))
      return fmt::format("layer {} mixer '{}'", l, mixer);
    if (ffn != "swiglu" && ffn != "gelu_mlp" && !(train && (ffn == "cem_mlp" || ffn == "cffn")))
      return fmt::format("layer {} ffn '{}'", l, ffn);
  }
  if (m.norm == NormKind::kLayerNorm && !m.bias) return "layernorm without bias";
  if (m.cem.attention == CemAttentionKernel::kLinear) return "cem.attention = linear";
  return "";
}

namespace fs = std::filesystem;

bool python_with_torch() {
  if (access(kPeerPython, X_OK) != 0) return false;
  const std::string cmd = std::string(kPeerPython) + " -c 'import torch' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

std::optional<fs::path> locate_peer(const std::string& given, const std::string& rel_path) {
  if (!given.empty()) {
    CEMFRAC_CHECK(fs::exists(given), "--peer-script {}: no such file", given);
    return fs::path(given);
  }
  std::vector<fs::path> roots;
  if (const char* env = std::getenv("CEMFRAC_SOURCE_DIR")) roots.emplace_back(env);
  roots.push_back(fs::current_path());
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path())
      roots.push_back(p);
  }
  for (const auto& root : roots)
    if (fs::exists(root / rel_path)) return root / rel_path;
  return std::nullopt;
}

std::string quote_for_shell(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string capture_stdout(const std::string& command, const std::string& what) {
  FILE* pipe = popen(command.c_str(), "r");
  CEMFRAC_CHECK(pipe != nullptr, "could not start: {}", command);
  std::string out;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = pclose(pipe);
  CEMFRAC_CHECK(status == 0, "{} failed (exit status {}); its message is above: {}", what, status,
                command);
  return out;
}

std::string run_peer(const std::string& command, const std::string& what,
                     const std::string& temp_file) {
  std::string out;
  try {
    out = capture_stdout(command, what);
  } catch (...) {
    std::error_code ec;
    fs::remove(temp_file, ec);
    throw;
  }
  std::error_code ec;
  fs::remove(temp_file, ec);
  return out;
}

}  // namespace cemfrac::cli
