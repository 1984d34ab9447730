// The one rule for a directory that receives a new run (train, finetune, and every other Trainer
// that writes files into a run directory of its own): it is new, or empty, or holds only what may
// precede a run; never a folder with a user's files, another run's checkpoints or a live writer. A
// run continued with --resume is the other way into a run directory (trainer.cpp). The GP task's
// training state is not a run directory: it lives in a job's folder (TrainerOptions::
// require_new_dir).
#pragma once
#include <cstdint>
#include <string>

namespace cemfrac {

// Refuses, in one line naming `key` (the setting or flag that chose `out`: "train.out", "--out"),
// an `out` that is the dataset directory `data_path` ("" = none), a file, a dangling link, a
// directory being written by another cemfrac process, one holding checkpoints (pointed at
// --resume), or one holding anything but the lock file and what `cemfrac compare` writes before it
// starts a training (compare-run.json, train.log). A run killed before its first checkpoint
// (summary.json "running", no live writer) may be started again in its folder.
void check_new_run_dir(const std::string& out, const std::string& key,
                       const std::string& data_path = "");

// The status a reader must report for the run directory `dir`: what its summary.json says
// ("completed", "interrupted", ...), except that "running" becomes "died" when no process holds the
// directory's lock (core/dir_lock.h): the writer was killed outright (SIGKILL, power loss), which
// leaves "running" behind. The kernel drops a dead process's lock, so this cannot be fooled by a
// reused pid. "" when there is no readable summary.json. `step` (optional) gets the summary's step.
std::string run_status(const std::string& dir, int64_t* step = nullptr);

}  // namespace cemfrac
