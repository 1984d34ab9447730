// cemfrac params: the exact parameter table of a run config's model, per tensor and per kind, total
// and non-embedding. The model is built on the meta device (shapes only, nothing allocated),
// through the same constructors that create and name the tensors of a real model.
#include <fmt/format.h>
#include <torch/types.h>

#include <map>
#include <nlohmann/json.hpp>

#include "cemfrac/core/check.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/train/run_config.h"
#include "cli/commands.h"
#include "cemfrac/core/format_util.h"

namespace cemfrac::cli {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out;
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? " x " : "") + std::to_string(shape[i]);
  return out;
}

const ParamKind kKinds[] = {ParamKind::kEmbedding, ParamKind::kAttention, ParamKind::kFfn,
                            ParamKind::kNorm, ParamKind::kHead};

}  // namespace

namespace {

// The counts of one model's parameter table (`cemfrac params`).
struct ParamCounts {
  std::map<ParamKind, int64_t> by_kind;
  int64_t total = 0;
  int64_t non_embedding = 0;
  std::string tied;  // "wte.weight = head.weight", or "" when nothing is tied
};

nlohmann::json params_json(const std::string& config_path, const std::vector<ParamInfo>& table,
                           ParamCounts& c) {
  std::map<ParamKind, int64_t>& by_kind = c.by_kind;
  const int64_t total = c.total, non_embedding = c.non_embedding;
  const std::string& tied = c.tied;
  nlohmann::json tensors = nlohmann::json::array();
  for (const ParamInfo& p : table) {
    nlohmann::json t = {{"name", p.name},
                        {"shape", p.shape},
                        {"numel", p.numel},
                        {"kind", to_string(p.kind)},
                        {"group", to_string(p.group)}};
    if (!p.tied_to.empty()) t["tied_to"] = p.tied_to;
    if (p.depth > 0) t["depth"] = p.depth;  // CoFrGeNet ladder depth (dyadic schedule)
    tensors.push_back(t);
  }
  nlohmann::json kinds = nlohmann::json::object();
  for (ParamKind kind : kKinds) kinds[to_string(kind)] = by_kind[kind];
  nlohmann::json j = {
      {"config", config_path},          {"tensors", tensors}, {"by_kind", kinds}, {"total", total},
      {"non_embedding", non_embedding}, {"tied", tied}};
  return j;
}

void print_params(const RunConfig& config, const std::vector<ParamInfo>& table, ParamCounts& c) {
  std::map<ParamKind, int64_t>& by_kind = c.by_kind;
  const int64_t total = c.total, non_embedding = c.non_embedding;
  const std::string& tied = c.tied;
  size_t name_width = 6, shape_width = 5;
  for (const ParamInfo& p : table) {
    name_width = std::max(name_width, p.name.size());
    shape_width = std::max(shape_width, shape_text(p.shape).size());
  }
  fmt::print("{:<{}}  {:<{}}  {:>13}  {:<9}  {}\n", "tensor", name_width, "shape", shape_width,
             "numel", "kind", "group");
  for (const ParamInfo& p : table) {
    fmt::print("{:<{}}  {:<{}}  {:>13}  {:<9}  {}{}\n", p.name, name_width, shape_text(p.shape),
               shape_width, with_commas(p.numel), to_string(p.kind), to_string(p.group),
               p.tied_to.empty() ? "" : "  (also " + p.tied_to + ", counted once)");
  }
  fmt::print("\nby kind\n");
  for (ParamKind kind : kKinds) {
    fmt::print("  {:<13}  {:>15}\n", to_string(kind), with_commas(by_kind[kind]));
  }
  fmt::print("total            {:>15}\n", with_commas(total));
  fmt::print(
      "non-embedding    {:>15}  (total minus kind embedding: wte{}; an untied head counts)\n",
      with_commas(non_embedding), config.model.positions == Positions::kLearned ? ", wpe" : "");
  fmt::print("tied             {}\n", tied.empty() ? "none" : tied + " (one tensor)");
}

}  // namespace

Command add_params(CLI::App& root, const GlobalOptions& global) {
  struct Flags {
    std::string config;
    std::vector<std::string> overrides;
    bool json = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* app = root.add_subcommand(
      "params",
      "Exact parameter count of a model config: per tensor, per kind, total, non-embedding");
  app->add_option("--config", flags->config, "Run config (TOML), e.g. configs/gpt2-124m.toml")
      ->required();
  app->add_option("--set", flags->overrides,
                  "Override a config value: section.key=value (repeatable)");
  app->add_flag("--json", flags->json, "Print one JSON object");
  auto run = [flags]() {
    const RunConfig config = load_run_config(flags->config, flags->overrides);
    LmModel model(config.model, torch::kMeta);
    const std::vector<ParamInfo> table = model->parameter_table();

    ParamCounts c;
    for (const ParamInfo& p : table) {
      c.by_kind[p.kind] += p.numel;
      c.total += p.numel;
    }
    // The table must account for every tensor of the model, each once.
    CEMFRAC_CHECK(c.total == model->num_parameters(),
                  "internal: parameter table sums to {} but the model has {} parameters", c.total,
                  model->num_parameters());
    c.non_embedding = c.total - c.by_kind[ParamKind::kEmbedding];
    for (const ParamInfo& p : table) {
      if (!p.tied_to.empty()) c.tied = p.tied_to + " = " + p.name;
    }
    if (flags->json) {
      fmt::print("{}\n", params_json(flags->config, table, c).dump(2));
      return 0;
    }
    print_params(config, table, c);
    return 0;
  };
  (void)global;
  return {app, run};
}

}  // namespace cemfrac::cli
