// cemfrac eval --task: lm-evaluation-harness-style zero-shot scoring of a checkpoint (eval/tasks.h).
#include "cli/eval_task.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cemfrac/core/check.h"
#include "cemfrac/core/clock.h"
#include "cemfrac/core/input_file.h"
#include "cemfrac/eval/brown_tasks.h"
#include "cemfrac/eval/tasks.h"
#include "cemfrac/train/model_loader.h"

namespace cemfrac::cli {

namespace {

using Clock = std::chrono::steady_clock;

// The task, a built-in name or a file (checked as every input file is: a directory or a FIFO is
// named as such, never opened), read and every line checked before a model is loaded.
TaskSet read_task(const EvalTaskArgs& a) {
  const RequestType request = parse_request_type(a.request);
  const bool is_file = !is_builtin_task(a.task) || std::filesystem::exists(a.task);
  if (is_file) {
    const std::string problem = input_file_problem(a.task);
    CEMFRAC_CHECK(problem.empty() || problem != "no such file",
                  "--task {}: no such file and no built-in task of that name (built-in: {})",
                  a.task, fmt::join(builtin_task_names(), ", "));
    CEMFRAC_CHECK(problem.empty(), "--task {}: {}; pass a task file (JSONL) or a built-in name",
                  a.task, problem);
  }
  TaskSet task = is_file ? read_task_file(a.task, request) : builtin_task(a.task);
  CEMFRAC_CHECK(request == RequestType::kAuto || request == task.type,
                "--request {}: the built-in task {} is {}", a.request, a.task, to_string(task.type));
  CEMFRAC_CHECK(a.stride == 0 || task.type == RequestType::kRolling,
                "--stride applies to rolling tasks only; {} is {}", a.task, to_string(task.type));
  return task;
}

// A progress line at most every second on a terminal (every 30 s in a log), and at the end.
std::function<void(int64_t, int64_t)> progress_printer(const std::string& name,
                                                       Clock::time_point start) {
  const bool tty = isatty(STDERR_FILENO);
  return [name, start, tty, last = start](int64_t done, int64_t total) mutable {
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - last).count();
    if (done < total && since < (tty ? 1.0 : 30.0)) return;
    last = now;
    const double elapsed = std::chrono::duration<double>(now - start).count();
    // Longest requests come first, so the rate only rises: the ETA is an upper bound.
    const double eta = elapsed / static_cast<double>(done) * static_cast<double>(total - done);
    const std::string line =
        fmt::format("{}: {}/{} requests | {:.1f} req/s | ETA {}", name, done, total,
                    done / std::max(elapsed, 1e-9), format_duration(eta));
    if (tty) {
      std::cerr << "\r" << line << "\033[K" << (done == total ? "\n" : "") << std::flush;
    } else {
      std::cerr << line << "\n";
    }
  };
}

// The human-readable result (without --json).
void print_result(const EvalTaskArgs& a, const TaskSet& task, const LoadedModel& loaded,
                  const nlohmann::json& r) {
  fmt::print("checkpoint   {} (step {})\n", loaded.checkpoint, loaded.step);
  for (const std::string& set : a.sets) fmt::print("set          {}\n", set);
  fmt::print("task         {} ({}, {} examples, {} requests)\n", task.name, to_string(task.type),
             task.size(), r["requests"].get<int64_t>());
  fmt::print("protocol     {}\n", r["protocol"].get<std::string>());
  const nlohmann::json& m = r["metrics"];
  auto with_err = [&](const char* key) {
    fmt::print("{:<13}{:.4f} ± {:.4f}\n", key, m[key].get<double>(),
               m[std::string(key) + "_stderr"].get<double>());
  };
  switch (task.type) {
    case RequestType::kMultipleChoice:
      with_err("acc");
      with_err("acc_norm");
      with_err("acc_bytes");
      fmt::print("chance       {:.4f}\n", m["chance"].get<double>());
      break;
    case RequestType::kCloze:
      with_err("acc");
      fmt::print("perplexity   {:.3f} (exp of minus the mean target log-likelihood)\n",
                 m["perplexity"].get<double>());
      fmt::print("token ppl    {:.3f} over {} target tokens\n", m["token_perplexity"].get<double>(),
                 m["target_tokens"].get<int64_t>());
      break;
    case RequestType::kRolling:
      fmt::print("word ppl     {:.3f} over {} words\n", m["word_perplexity"].get<double>(),
                 m["words"].get<int64_t>());
      fmt::print("byte ppl     {:.4f} over {} bytes\n", m["byte_perplexity"].get<double>(),
                 m["bytes"].get<int64_t>());
      fmt::print("bits/byte    {:.4f}\n", m["bits_per_byte"].get<double>());
      fmt::print("token ppl    {:.3f} over {} tokens\n", m["token_perplexity"].get<double>(),
                 m["tokens"].get<int64_t>());
      break;
    case RequestType::kAuto: break;
  }
}

}  // namespace

int run_eval_task(const EvalTaskArgs& a) {
  const TaskSet task = read_task(a);
  LoadedModel loaded = load_model(a.checkpoint, a.sets, a.device);
  CEMFRAC_CHECK(loaded.tokenizer != nullptr,
                "{} has no tokenizer/ directory: cannot encode the task for it", loaded.checkpoint);
  LmModel model = loaded.model;
  const auto params = model->parameters();
  const torch::Device device = params.empty() ? torch::Device(torch::kCPU) : params[0].device();

  TaskOptions options;
  options.context = model->config().context;
  options.batch = a.batch;
  options.stride = a.stride;
  CEMFRAC_CHECK(a.stride >= 0 && a.stride <= options.context,
                "--stride {}: must be 1..context {} (or 0: the context)", a.stride,
                options.context);
  const auto start = Clock::now();
  options.progress = progress_printer(task.name, start);
  auto logits = [model, device](const torch::Tensor& x) mutable {
    return model->forward(x.to(device));
  };
  nlohmann::json r = evaluate_task(task, *loaded.tokenizer, logits, options);
  r["checkpoint"] = loaded.checkpoint;
  r["step"] = loaded.step;
  r["tokenizer"] = loaded.tokenizer->id();
  r["set"] = a.sets;
  r["seconds"] = std::chrono::duration<double>(Clock::now() - start).count();
  if (a.json) {
    fmt::print("{}\n", r.dump(2));
    return 0;
  }
  print_result(a, task, loaded, r);
  return 0;
}

}  // namespace cemfrac::cli
