// What a suite's folders hold and how they are read: the paths of a run's results (eval-*.json,
// gp-run.json), its status (summary.json) and checkpoints, and tolerant readers for the files a
// child process writes (a missing or half-written file reads as absent, never as an error).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace cemfrac {

// A learning rate as the suite's folders and settings spell it: 0.003 -> "0.003".
std::string lr_text(double lr);

// The whole file, "" when it cannot be read.
std::string file_text(const std::string& path);
// The file's last non-empty line ("" when none).
std::string last_line(const std::string& path);
// A child's one-line error from its log ("cemfrac: error: ..."), else the log's last line.
std::string log_problem(const std::string& path);
// The JSON document in `path`; nullopt when missing or not (yet) valid JSON.
std::optional<nlohmann::json> read_json(const std::string& path);
// One JSON value per line; a line cut by a crash ends the list (the lines before it stand).
std::vector<nlohmann::json> read_jsonl(const std::string& path);

// The `tokens` of a training run's last metrics.jsonl line (0 when none).
int64_t run_tokens_now(const std::string& dir);
// Whether <dir>/checkpoints holds a step-* checkpoint.
bool has_checkpoint(const std::string& dir);

// A GP run's result (`cemfrac gp --one`'s JSON).
std::string gp_result_path(const std::string& dir);
// The file name's stem: "texts/extra.txt" -> "extra".
std::string stem(const std::string& path);
// An LM run's evaluation on `split` (with a test-time `variant`, "" for none), and on an eval text.
std::string eval_path(const std::string& dir, const std::string& split, const std::string& variant);
std::string text_eval_path(const std::string& dir, const std::string& text);
// An LM run's zero-shot task result (`eval --task --json`), by the task's key (suite.h task_key).
std::string task_eval_path(const std::string& dir, const std::string& key);
// The folder of one fine-tuning of the run in `dir` (its finetune.json holds the metrics); their
// settings are ft-<name>/compare-run.json.
std::string finetune_dir(const std::string& dir, const std::string& name, uint64_t seed);

}  // namespace cemfrac
