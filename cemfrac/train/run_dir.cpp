#include "cemfrac/train/run_dir.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>
#include <vector>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/dir_lock.h"
#include "cemfrac/train/checkpoint.h"

namespace cemfrac {
namespace {

namespace fs = std::filesystem;

bool same_directory(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  const fs::path pa = fs::weakly_canonical(a, ec1), pb = fs::weakly_canonical(b, ec2);
  if (ec1 || ec2) return fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
  return pa == pb;
}

// Files a fresh run may find in its directory: the lock file, and what `cemfrac compare` writes
// there before it starts the training (its settings record and the training's log).
bool may_precede_a_run(const std::string& name) {
  return name == kDirLockFile || name == "compare-run.json" || name == "train.log";
}

}  // namespace

void check_new_run_dir(const std::string& out, const std::string& key,
                       const std::string& data_path) {
  CEMFRAC_CHECK(data_path.empty() || !same_directory(out, data_path),
                "{} = {} is the dataset directory (data.path): choose another run directory", key,
                out);
  std::error_code ec;
  const fs::file_status status = fs::status(out, ec);
  if (!fs::exists(status)) {
    CEMFRAC_CHECK(!fs::is_symlink(fs::symlink_status(out, ec)),
                  "{} = {} is a dangling symbolic link: remove it or choose another {}", key, out,
                  key);
    return;
  }
  CEMFRAC_CHECK(fs::is_directory(status),
                "{} = {} exists and is not a directory: choose another {}", key, out, key);
  if (const auto holder = dir_lock_holder(out))
    fail("{} is being written by another cemfrac process ({}{}); wait for it to finish or stop it",
         out, holder->pid > 0 ? fmt::format("pid {}", holder->pid) : std::string("pid unknown"),
         holder->command.empty() ? "" : ", " + holder->command);
  CEMFRAC_CHECK(list_checkpoints(out).empty(),
                "{} already holds checkpoints; pass --resume {} to continue that run or choose "
                "another {}",
                out, out, key);
  // A run killed before its first checkpoint (summary.json still "running", its writer gone: the
  // lock above is free) has nothing to resume: the same command starts it again from step 0.
  const std::string summary = (fs::path(out) / "summary.json").string();
  if (fs::is_regular_file(summary, ec)) {
    const nlohmann::json s = nlohmann::json::parse(read_file(summary), nullptr, false);
    if (s.is_object() &&
        parse_run_status(s.value("status", nlohmann::json())) == RunStatus::kRunning)
      return;
  }
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (!may_precede_a_run(name)) found.push_back(name);
  }
  CEMFRAC_CHECK(!ec, "cannot list {} = {}: {}", key, out, ec.message());
  if (found.empty()) return;
  std::sort(found.begin(), found.end());
  const size_t shown = std::min<size_t>(found.size(), 4);
  std::string names = fmt::format("{}", fmt::join(found.begin(), found.begin() + shown, ", "));
  if (found.size() > shown) names += fmt::format(" and {} more", found.size() - shown);
  fail(
      "{} = {} is not empty (it holds {}): a new run writes only into a new or empty directory; "
      "choose another {}, or remove what is there",
      key, out, names, key);
}

RunStatus parse_run_status(const nlohmann::json& status) {
  if (!status.is_string()) return RunStatus::kNone;
  return enum_from_name<RunStatus>(status.get<std::string>()).value_or(RunStatus::kNone);
}

RunStatus run_status(const std::string& dir, int64_t* step) {
  std::error_code ec;
  const std::string path = (fs::path(dir) / "summary.json").string();
  if (!fs::is_regular_file(path, ec)) return RunStatus::kNone;
  nlohmann::json s;
  try {
    s = nlohmann::json::parse(read_file(path), nullptr, false);
  } catch (const std::exception&) {
    return RunStatus::kNone;  // unreadable now (removed while read): no status
  }
  if (!s.is_object() || !s.contains("status")) return RunStatus::kNone;
  if (step && s.contains("step") && s["step"].is_number_integer()) *step = s["step"].get<int64_t>();
  const RunStatus status = parse_run_status(s["status"]);
  if (status == RunStatus::kRunning && !dir_lock_holder(dir)) return RunStatus::kDied;
  return status;
}

}  // namespace cemfrac
