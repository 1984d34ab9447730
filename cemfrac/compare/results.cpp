#include "cemfrac/compare/results.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cemfrac/compare/run_files.h"
#include "cemfrac/core/clock.h"
#include "cemfrac/train/run_dir.h"

namespace cemfrac {
using json = nlohmann::json;

SeedResult collect(const std::string& dir, uint64_t seed, const Suite& suite, const SuiteRun& run) {
  SeedResult r;
  r.seed = seed;
  const auto summary = read_json(dir + "/summary.json");
  r.diverged =
      summary && parse_run_status(summary->value("status", json())) == RunStatus::kDiverged;
  if (summary) {
    if ((*summary)["last_val_loss"].is_number())
      r.val_loss = (*summary)["last_val_loss"].get<double>();
    if ((*summary)["best_val_loss"].is_number())
      r.best_val_loss = (*summary)["best_val_loss"].get<double>();
  }
  std::vector<double> rates;
  for (const json& m : read_jsonl(dir + "/metrics.jsonl")) {
    if (m["tokens_per_s"].is_number()) rates.push_back(m["tokens_per_s"].get<double>());
    if (m["elapsed_s"].is_number()) r.train_s = m["elapsed_s"].get<double>();
    if (m["val_loss"].is_number())
      r.val_curve.emplace_back(m["tokens"].get<double>(), m["val_loss"].get<double>());
  }
  r.tokens_per_s = median(rates);
  if (const auto e = read_json(eval_path(dir, suite.eval_split, ""))) {
    r.test_loss = (*e)["mean_loss"].get<double>();
    r.test_ppl = (*e)["perplexity"].get<double>();
    if ((*e)["bits_per_byte"].is_number()) r.test_bpb = (*e)["bits_per_byte"].get<double>();
  }
  for (const SuiteVariant& v : run.variants)
    if (const auto e = read_json(eval_path(dir, suite.eval_split, v.name)))
      r.variant_loss[v.name] = (*e)["mean_loss"].get<double>();
  for (const std::string& t : suite.eval_text)
    if (const auto e = read_json(text_eval_path(dir, t)))
      r.text_loss[stem(t)] = (*e)["mean_loss"].get<double>();
  auto number = [](const json& j, const char* key) -> std::optional<double> {
    if (!j.is_object() || !j.contains(key) || !j.at(key).is_number()) return std::nullopt;
    return j.at(key).get<double>();
  };
  for (const std::string& t : suite.tasks) {
    const auto e = read_json(task_eval_path(dir, task_key(t)));
    if (!e) continue;
    const json m = e->value("metrics", json());
    if (const auto acc = number(m, "acc")) r.task_acc[task_key(t)] = *acc;
    if (const auto acc = number(m, "acc_norm")) r.task_acc_norm[task_key(t)] = *acc;
    if (const auto chance = number(m, "chance")) r.task_chance[task_key(t)] = *chance;
  }
  for (const SuiteFinetune& f : suite.finetunes) {
    r.finetune_seeds[f.name] = f.seeds.size();
    for (uint64_t k : f.seeds) {
      const auto e = read_json(finetune_dir(dir, f.name, k) + "/finetune.json");
      if (!e || !e->contains("evals") || !(*e)["evals"].is_object() || (*e)["evals"].empty())
        continue;
      const json& evals = (*e)["evals"];
      const json& set = evals.contains("test") ? evals["test"] : evals.begin().value();
      if (const auto acc = number(set, "acc")) r.finetune_acc[f.name].push_back(*acc);
      if (const auto majority = number(set, "majority")) r.finetune_majority[f.name] = *majority;
    }
  }
  return r;
}

SeedResult collect_gp(const std::string& dir, uint64_t seed, const SuiteRun& run) {
  SeedResult r;
  r.seed = seed;
  const auto j = read_json(gp_result_path(dir));
  if (!j) return r;
  r.diverged = parse_run_status(j->value("status", json())) == RunStatus::kDiverged;
  r.train_s = j->value("train_s", 0.0);
  r.steps_done = j->value("steps_done", int64_t{0});
  if (r.train_s > 0) r.tokens_per_s = static_cast<double>(r.steps_done) / r.train_s;  // steps/s
  auto rmse = [](const json& e, const char* key) -> std::optional<double> {
    if (!e.is_object() || !e.contains(key) || !e.at(key).is_number()) return std::nullopt;
    return e.at(key).get<double>();
  };
  if (r.diverged) return r;
  r.val_rmse = rmse(j->value("val", json()), "rmse_posterior");
  r.val_loss = r.val_rmse;
  r.test_rmse = rmse(j->value("test", json()), "rmse_posterior");
  r.test_rmse_targets = rmse(j->value("test", json()), "rmse_targets");
  if (j->contains("oracle_test_rmse_targets") && j->at("oracle_test_rmse_targets").is_number())
    r.oracle_rmse_targets = j->at("oracle_test_rmse_targets").get<double>();
  const json at = j->value("test_at_T", json::object());
  for (const SuiteVariant& v : run.variants) {
    const std::string key = std::to_string(v.cem_steps);
    if (at.contains(key))
      if (auto x = rmse(at.at(key), "rmse_posterior")) r.variant_loss[v.name] = *x;
  }
  return r;
}

SuiteResults collect_results(const Suite& suite, const std::vector<RunPlan>& plans,
                             const std::string& out) {
  SuiteResults results;
  for (const RunPlan& p : plans)
    for (uint64_t seed : p.run->seeds) {
      const std::string dir = final_dir(out, *p.run, seed);
      results[p.run->name].push_back(p.gp ? collect_gp(dir, seed, *p.run)
                                          : collect(dir, seed, suite, *p.run));
    }
  return results;
}

std::optional<double> metric_of(const SeedResult& r, const std::string& metric,
                                const std::string& variant) {
  if (r.diverged) return std::nullopt;
  if (!variant.empty()) {
    auto it = r.variant_loss.find(variant);
    return it == r.variant_loss.end() ? std::nullopt : std::optional<double>(it->second);
  }
  if (metric == "test_loss") return r.test_loss;
  if (metric == "val_loss") return r.val_loss;
  if (metric == "test_rmse") return r.test_rmse;
  if (metric == "val_rmse") return r.val_rmse;
  if (metric == "test_rmse_targets") return r.test_rmse_targets;
  const auto [kind, key] = downstream_metric(metric);
  if (kind == "task_error" || kind == "task_error_norm") {
    const auto& acc = kind == "task_error" ? r.task_acc : r.task_acc_norm;
    const auto it = acc.find(key);
    return it == acc.end() ? std::nullopt : std::optional<double>(1 - it->second);
  }
  if (kind == "finetune_error") {
    const auto it = r.finetune_acc.find(key);
    if (it == r.finetune_acc.end() || it->second.size() != r.finetune_seeds.at(key))
      return std::nullopt;
    double sum = 0;
    for (double a : it->second) sum += a;
    return 1 - sum / static_cast<double>(it->second.size());
  }
  const std::string name = metric.substr(std::string("text_loss:").size());
  auto it = r.text_loss.find(name);
  return it == r.text_loss.end() ? std::nullopt : std::optional<double>(it->second);
}

}  // namespace cemfrac
