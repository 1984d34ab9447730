// The one rule for a directory that receives a new run (train, finetune, and every other Trainer
// that writes files into a run directory of its own): it is new, or empty, or holds only what may
// precede a run; never a folder with a user's files, another run's checkpoints or a live writer. A
// run continued with --resume is the other way into a run directory (trainer.cpp). The GP task's
// training state is not a run directory: it lives in a job's folder (TrainerOptions::
// require_new_dir).
#pragma once
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <utility>
#include <string>

#include "cemfrac/core/fields.h"

namespace cemfrac {

// Refuses, in one line naming `key` (the setting or flag that chose `out`: "train.out", "--out"),
// an `out` that is the dataset directory `data_path` ("" = none), a file, a dangling link, a
// directory being written by another cemfrac process, one holding checkpoints (pointed at
// --resume), or one holding anything but the lock file and what `cemfrac compare` writes before it
// starts a training (compare-run.json, train.log). A run killed before its first checkpoint
// (summary.json "running", no live writer) may be started again in its folder.
void check_new_run_dir(const std::string& out, const std::string& key,
                       const std::string& data_path = "");

// A run directory's state, as summary.json's "status" spells it (the JSON names do not change):
// kNone when there is no readable summary (or a status this build does not know); kDied is never
// written, only read (run_status below).
enum class RunStatus { kNone, kRunning, kCompleted, kInterrupted, kStopped, kDiverged, kDied };
template <>
struct EnumNames<RunStatus> {
  static constexpr std::array<std::pair<RunStatus, const char*>, 7> kNames = {
      {{RunStatus::kNone, ""},
       {RunStatus::kRunning, "running"},
       {RunStatus::kCompleted, "completed"},
       {RunStatus::kInterrupted, "interrupted"},
       {RunStatus::kStopped, "stopped"},
       {RunStatus::kDiverged, "diverged"},
       {RunStatus::kDied, "died"}}};
};

// A summary's "status" value (kNone for anything else, a missing or non-string value included).
RunStatus parse_run_status(const nlohmann::json& status);

// Whether a training ended for good: completed, or diverged (a result too; nothing to resume).
inline bool run_ended(RunStatus s) {
  return s == RunStatus::kCompleted || s == RunStatus::kDiverged;
}

// The status a reader must report for the run directory `dir`: what its summary.json says, except
// that kRunning becomes kDied when no process holds the directory's lock (core/dir_lock.h): the
// writer was killed outright (SIGKILL, power loss), which leaves "running" behind. The kernel drops
// a dead process's lock, so this cannot be fooled by a reused pid. `step` (optional) gets the
// summary's step.
RunStatus run_status(const std::string& dir, int64_t* step = nullptr);

}  // namespace cemfrac
