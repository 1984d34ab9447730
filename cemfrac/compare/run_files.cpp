#include "cemfrac/compare/run_files.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cemfrac/train/run_dir.h"

namespace cemfrac {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string lr_text(double lr) {
  return fmt::format("{:g}", lr);
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string last_line(const std::string& path) {
  const std::string text = file_text(path);
  auto end = text.find_last_not_of("\n");
  if (end == std::string::npos) return "";
  auto begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end - (begin == std::string::npos ? 0 : begin + 1) + 1);
}

std::string log_problem(const std::string& path) {
  const std::string text = file_text(path);
  const auto at = text.rfind("cemfrac: ");
  if (at != std::string::npos && (at == 0 || text[at - 1] == '\n')) {
    const auto end = text.find('\n', at);
    return text.substr(at, end == std::string::npos ? std::string::npos : end - at);
  }
  return last_line(path);
}

std::optional<json> read_json(const std::string& path) {
  if (!fs::exists(path)) return std::nullopt;
  try {
    return json::parse(file_text(path));
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(file_text(path));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    try {
      out.push_back(json::parse(line));
    } catch (const json::exception&) {
      break;  // a line cut by a crash: the lines before it stand
    }
  }
  return out;
}

int64_t run_tokens_now(const std::string& dir) {
  const std::string line = last_line(dir + "/metrics.jsonl");
  if (line.empty()) return 0;
  try {
    return json::parse(line).value("tokens", int64_t{0});
  } catch (const json::exception&) {
    return 0;
  }
}

bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir + "/checkpoints", ec)) return false;
  for (const auto& e : fs::directory_iterator(dir + "/checkpoints", ec))
    if (e.path().filename().string().rfind("step-", 0) == 0) return true;
  return false;
}

std::string gp_result_path(const std::string& dir) {
  return dir + "/gp-run.json";
}

std::string stem(const std::string& path) {
  return fs::path(path).stem().string();
}

std::string eval_path(const std::string& dir, const std::string& split,
                      const std::string& variant) {
  return variant.empty() ? fmt::format("{}/eval-{}.json", dir, split)
                         : fmt::format("{}/eval-{}@{}.json", dir, split, variant);
}

std::string text_eval_path(const std::string& dir, const std::string& text) {
  return fmt::format("{}/eval-text-{}.json", dir, stem(text));
}

std::string task_eval_path(const std::string& dir, const std::string& key) {
  return fmt::format("{}/task-{}.json", dir, key);
}

std::string finetune_dir(const std::string& dir, const std::string& name, uint64_t seed) {
  return fmt::format("{}/ft-{}/seed-{}", dir, name, seed);
}

}  // namespace cemfrac
