#include "cemfrac/compare/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <thread>

#include "cemfrac/compare/run_files.h"
#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/blas.h"
#include "cemfrac/core/check.h"
#include "cemfrac/train/run_dir.h"

namespace cemfrac {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// An unfinished run with no checkpoint to resume from (stopped before its first one, or a folder
// kept without its checkpoints, e.g. a committed suite): what it wrote is dropped, so that it
// starts again from step 0 into a clean folder (its log and metrics start afresh). The folder is
// the suite's own (check_settings has seen its compare-run.json, which stays).
void clear_run_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() == "compare-run.json") continue;
    fs::remove_all(e.path());
  }
}

void write_settings(const std::string& dir, const json& settings) {
  fs::create_directories(dir);
  write_file_atomic(dir + "/compare-run.json", settings.dump(2) + "\n");
}

}  // namespace

int64_t tokens_per_step(const RunConfig& c) {
  if (c.train.tokens_per_step > 0) return c.train.tokens_per_step;
  const int64_t seq = c.train.seq_len > 0 ? c.train.seq_len : c.model.context;
  return c.train.micro_batch * seq;
}

TrainSpec make_train(const SuiteRun& run, const std::string& data, const std::string& label,
                     const std::string& dir, int64_t tokens, double lr, double lr_min_ratio,
                     uint64_t seed, int64_t val_points, const std::vector<std::string>& extra) {
  const RunConfig base = load_run_config(run.config, run.sets);
  const int64_t per_step = tokens_per_step(base);
  const int64_t steps = std::max<int64_t>(1, (tokens + per_step - 1) / per_step);
  TrainSpec t;
  t.label = label;
  t.config = run.config;
  t.sets = run.sets;
  t.dir = dir;
  t.steps = steps;
  t.tokens = steps * per_step;
  const std::vector<std::string> budget = {
      fmt::format("train.steps={}", steps),
      fmt::format("train.warmup_steps={}", std::max<int64_t>(1, steps / 10)),
      fmt::format("train.lr_max={}", lr_text(lr)),
      fmt::format("train.lr_min={}", lr_text(lr * lr_min_ratio)),
      fmt::format("train.seed={}", seed),
      fmt::format("train.eval_every={}", std::max<int64_t>(1, steps / val_points)),
      fmt::format("train.log_every={}", std::max<int64_t>(1, steps / 200)),
      fmt::format("train.checkpoint_every={}", std::max<int64_t>(1, steps / 5)),
      "train.keep_checkpoints=1",
  };
  t.sets.insert(t.sets.end(), budget.begin(), budget.end());
  // The suite's dataset (only when the config names another, so the recorded settings stay short).
  if (base.data.path != data) t.sets.push_back("data.path=" + data);
  t.sets.insert(t.sets.end(), extra.begin(), extra.end());
  (void)load_run_config(t.config, t.sets);  // checked now
  return t;
}

json train_settings(const TrainSpec& t) {
  return {{"config", t.config}, {"set", t.sets}};
}

void check_settings(const std::string& dir, const json& settings) {
  const std::string stamp = dir + "/compare-run.json";
  if (const auto old = read_json(stamp)) {
    CEMFRAC_CHECK(
        *old == settings,
        "{} was trained with other settings than the suite now gives (see {}): remove that "
        "directory to train it again, or restore the suite",
        dir, stamp);
  } else if (fs::exists(dir) && !fs::is_empty(dir)) {
    fail("{} exists and was not made by cemfrac compare: remove it or choose another --out", dir);
  }
}

std::optional<Job> train_job(const TrainSpec& t, double est_s_per_token) {
  const json settings = train_settings(t);
  check_settings(t.dir, settings);
  if (run_ended(run_status(t.dir))) return std::nullopt;
  if (!has_checkpoint(t.dir)) clear_run_dir(t.dir);
  write_settings(t.dir, settings);
  Job j;
  j.label = t.label;
  j.dir = t.dir;
  j.log = t.dir + "/train.log";
  j.tokens = t.tokens;
  j.est_s = est_s_per_token * static_cast<double>(t.tokens);
  j.args = {"train", "--config", t.config, "--out", t.dir, "--quiet"};
  for (const std::string& s : t.sets) {
    j.args.push_back("--set");
    j.args.push_back(s);
  }
  if (has_checkpoint(t.dir)) {
    j.args.push_back("--resume");
    j.args.push_back(t.dir);
  }
  return j;
}

std::optional<Job> task_job(const std::string& dir, const std::string& task,
                            const std::string& label, double est_s) {
  const std::string path = task_eval_path(dir, task_key(task));
  if (fs::exists(path)) return std::nullopt;
  Job j;
  j.label = label;
  j.capture = path;
  j.log = dir + "/eval.log";
  j.est_s = est_s;
  j.args = {"eval", "--checkpoint", dir, "--task", task, "--json"};
  return j;
}

std::optional<Job> finetune_job(const std::string& dir, const SuiteFinetune& f, uint64_t seed,
                                const std::string& label, double est_s) {
  const std::string out = finetune_dir(dir, f.name, seed);
  const std::string parent = fs::path(out).parent_path().string();
  const json settings = {{"task", f.task},     {"data", f.data},   {"lr", f.lr},
                         {"epochs", f.epochs}, {"batch", f.batch}, {"max_len", f.max_len}};
  check_settings(parent, settings);  // finished or not: a result is kept only with its settings
  if (fs::exists(out + "/finetune.json")) return std::nullopt;
  // Only once the run is trained may its folder hold ft-<name>/ (a training refuses a folder with
  // more than its settings): the record is written as the job starts.
  std::error_code ec;
  const bool resume = has_checkpoint(out);
  if (!resume) fs::remove_all(out, ec);  // stopped before its first checkpoint: start again
  Job j;
  j.write_first = {{parent + "/compare-run.json", settings.dump(2) + "\n"}};
  j.label = label;
  j.dir = out;
  j.log = parent + fmt::format("/seed-{}.log", seed);
  j.est_s = est_s;
  j.args = {"finetune", "--task", f.task};
  if (!f.data.empty()) j.args.insert(j.args.end(), {"--data", f.data});
  if (resume) {
    j.args.insert(j.args.end(), {"--resume", out});
  } else {
    j.args.insert(j.args.end(), {"--checkpoint", dir, "--out", out});
  }
  j.args.insert(j.args.end(), {"--seed", std::to_string(seed), "--lr", lr_text(f.lr), "--epochs",
                               fmt::format("{}", f.epochs), "--batch", std::to_string(f.batch),
                               "--max-len", std::to_string(f.max_len), "--quiet"});
  return j;
}

GpSpec make_gp(const Suite& suite, const SuiteRun& run, const std::string& label,
               const std::string& dir, int64_t steps, double lr, uint64_t seed, int64_t val_seqs,
               bool test) {
  const SuiteGp& g = suite.gp;
  GpSpec spec;
  spec.label = label;
  spec.dir = dir;
  spec.steps = steps;
  spec.args = {"gp",
               "--one",
               "--train-steps",
               std::to_string(steps),
               "--batch",
               std::to_string(g.batch),
               "--layers",
               std::to_string(run.gp.layers),
               "--positions",
               g.positions,
               "--lr",
               lr_text(lr),
               "--seed",
               std::to_string(seed),
               "--eval-seed",
               std::to_string(g.eval_seed),
               "--val-seqs",
               std::to_string(val_seqs),
               "--eval-seqs",
               std::to_string(test ? g.test_seqs : 0)};
  // Only when set, so that the settings (compare-run.json) of a suite without it stay those of
  // earlier runs and their finished jobs are reused.
  if (!run.gp.ffn.empty()) spec.args.insert(spec.args.end(), {"--ffn", run.gp.ffn});
  if (run.gp.model == GpModelKind::kLlama) {
    spec.args.insert(spec.args.end(), {"--model", "llama"});
  } else {
    spec.args.insert(spec.args.end(),
                     {"--variants", run.gp.variant, "--steps", std::to_string(run.gp.T)});
    std::vector<std::string> ts;
    for (const SuiteVariant& v : run.variants) ts.push_back(std::to_string(v.cem_steps));
    if (test && !ts.empty())
      spec.args.insert(spec.args.end(), {"--eval-steps", fmt::format("{}", fmt::join(ts, ","))});
  }
  return spec;
}

json gp_settings(const GpSpec& spec) {
  return {{"task", "gp"}, {"args", spec.args}};
}

bool drop_stale_timing(const std::string& dir, const json& settings) {
  const auto old = read_json(dir + "/compare-run.json");
  if (!old || *old == settings) return false;
  fs::remove_all(dir);
  return true;
}

std::optional<Job> gp_job(const GpSpec& spec, const SuiteGp& g, double est_s) {
  const json settings = gp_settings(spec);
  check_settings(spec.dir, settings);
  if (read_json(gp_result_path(spec.dir))) return std::nullopt;
  write_settings(spec.dir, settings);
  Job j;
  j.label = spec.label;
  // Resumable: the child keeps its training state in <dir>/checkpoints and resumes from it (an
  // interrupted GP run goes on where it stopped); the folder is removed once gp-run.json is kept.
  // Not part of the settings: where the state lives is not what the run is.
  j.args = spec.args;
  j.args.insert(j.args.end(), {"--checkpoint-dir", spec.dir});
  j.remove_after = spec.dir + "/checkpoints";
  j.dir = spec.dir;  // its checkpoints (a resumed run's starting step)
  j.steps = spec.steps;
  j.capture = gp_result_path(spec.dir);
  j.log = spec.dir + "/gp.log";
  j.est_s = est_s;
  j.threads = static_cast<int>(g.threads);
  return j;
}

std::string machine_key() {
  const CpuFeatures cpu = read_cpu_features();
  return fmt::format("{} {} ({} CPU flags), {} hardware threads, BLAS core {}", cpu.vendor,
                     cpu.model_name, cpu.flags.size(), std::thread::hardware_concurrency(),
                     blas_status().core);
}

std::string discard_other_machines_timings(const std::string& out, const std::string& here) {
  const fs::path plan = fs::path(out) / "plan";
  const fs::path marker = plan / "machine.txt";
  std::string there, line;
  if (fs::exists(marker)) {
    there = file_text(marker.string());
    while (!there.empty() && (there.back() == '\n' || there.back() == '\r')) there.pop_back();
  }
  std::vector<fs::path> timed;
  if (fs::is_directory(plan))
    for (const auto& e : fs::directory_iterator(plan))
      if (e.is_directory()) timed.push_back(e.path());
  if (!timed.empty() && there != here) {
    line = fmt::format(
        "plan: the {} timed run(s) in {} were taken {}; timing again on this machine ({})",
        timed.size(), plan.string(),
        there.empty() ? "on a machine not recorded" : "on another machine (" + there + ")", here);
    for (const fs::path& d : timed) fs::remove_all(d);
  }
  fs::create_directories(plan);
  if (there != here) write_file_atomic(marker.string(), here + "\n");
  return line;
}

std::string lr_dir(const std::string& out, const SuiteRun& run, double lr) {
  return fmt::format("{}/lr/{}/lr-{}", out, run.name, lr_text(lr));
}

std::string final_dir(const std::string& out, const SuiteRun& run, uint64_t seed) {
  return fmt::format("{}/final/{}/seed-{}", out, run.name, seed);
}

bool run_finished(const RunPlan& p, const std::string& dir) {
  if (p.gp) return fs::exists(gp_result_path(dir));
  return run_ended(run_status(dir));
}

bool searches_lr(RunPlan& p) {
  const SuiteRun& r = *p.run;
  if (!r.lr_from.empty()) return false;  // set from the other run by choose_learning_rates
  if (r.lr.size() == 1) {
    p.lr = r.lr[0];
    return false;
  }
  return true;
}

void choose_learning_rates(std::vector<RunPlan>& plans, const std::string& out) {
  for (RunPlan& p : plans) {
    const SuiteRun& r = *p.run;
    if (!searches_lr(p)) continue;
    double best = std::numeric_limits<double>::infinity();
    bool grid_done = true;  // false only with --report, before the search has finished
    for (double lr : r.lr) {
      const std::string dir = lr_dir(out, r, lr);
      if (!run_finished(p, dir)) {
        grid_done = false;
        continue;
      }
      std::optional<double> v;
      if (p.gp) {
        // The validation RMSE against the posterior mean (a diverged value has none).
        const auto s = read_json(gp_result_path(dir));
        const json val = s ? s->value("val", json()) : json();
        if (s && parse_run_status(s->value("status", json())) == RunStatus::kCompleted &&
            val.is_object() && val.contains("rmse_posterior") &&
            val.at("rmse_posterior").is_number())
          v = val.at("rmse_posterior").get<double>();
      } else {
        const auto s = read_json(dir + "/summary.json");
        if (s && parse_run_status(s->value("status", json())) == RunStatus::kCompleted &&
            (*s)["last_val_loss"].is_number())
          v = (*s)["last_val_loss"].get<double>();
      }
      p.lr_search[lr_text(lr)] = v;
      if (v && *v < best) {
        best = *v;
        p.lr = lr;
      }
    }
    if (!grid_done) {
      p.lr = 0;  // not chosen yet: the report shows the grid values finished so far
      continue;
    }
    CEMFRAC_CHECK(p.lr > 0, "run '{}': every learning rate of the grid diverged", r.name);
  }
  for (RunPlan& p : plans)
    if (!p.run->lr_from.empty())
      for (const RunPlan& q : plans)
        if (q.run->name == p.run->lr_from) p.lr = q.lr;
}

}  // namespace cemfrac
