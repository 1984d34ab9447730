// `cemfrac eval --task FILE|NAME` (cli/eval_task.cpp): zero-shot task scoring, called by cli/eval.cpp.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace cemfrac::cli {

struct EvalTaskArgs {
  std::string checkpoint;
  std::vector<std::string> sets;  // --set overrides
  std::string task;               // a JSONL file or a built-in name
  std::string request = "auto";   // --request
  int64_t batch = 8;
  int64_t stride = 0;  // rolling: 0 = context (the harness's windows)
  bool json = false;
  c10::Device device = c10::kCPU;  // where the model runs (--device)
};

int run_eval_task(const EvalTaskArgs& args);

}  // namespace cemfrac::cli
