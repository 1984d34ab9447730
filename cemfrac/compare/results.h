// A suite's results, read back from its final-run folders: per run and seed, the losses (LM:
// summary.json, metrics.jsonl, eval-*.json) or RMSEs (GP: gp-run.json). A seed not finished yet
// has empty values; a diverged one is marked and has none.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cemfrac/compare/plan.h"
#include "cemfrac/compare/suite.h"

namespace cemfrac {

struct SeedResult {
  uint64_t seed = 0;
  bool diverged = false;
  std::optional<double> val_loss;  // last validation of the run (GP: the validation RMSE)
  std::optional<double> best_val_loss;
  std::optional<double> test_loss, test_ppl, test_bpb;
  std::map<std::string, double> text_loss;     // stem -> loss
  std::map<std::string, double> variant_loss;  // variant -> loss on the eval split (GP: test RMSE)
  // Downstream (LM): zero-shot task key -> acc and acc_norm (multiple choice only); fine-tuning
  // name -> accuracy on its evaluation set "test" (else its first), one per fine-tuning seed kept.
  std::map<std::string, double> task_acc, task_acc_norm;
  std::map<std::string, std::vector<double>> finetune_acc;
  std::map<std::string, size_t> finetune_seeds;  // how many seeds each fine-tuning has in all
  // The floors: a multiple-choice task's chance accuracy; a fine-tuning evaluation set's
  // majority-class accuracy (the same for every seed).
  std::map<std::string, double> task_chance, finetune_majority;
  // GP runs: RMSE against the posterior mean (validation, test) and against the noisy targets.
  std::optional<double> val_rmse, test_rmse, test_rmse_targets, oracle_rmse_targets;
  int64_t steps_done = 0;
  double tokens_per_s = 0;  // median over logged steps (GP: steps per second)
  double train_s = 0;
  std::vector<std::pair<double, double>> val_curve;  // (tokens, val loss)
};

// An LM run's seed from its folder `dir`.
SeedResult collect(const std::string& dir, uint64_t seed, const Suite& suite, const SuiteRun& run);
// A GP run's seed, from the gp-run.json of `cemfrac gp --one` in `dir`.
SeedResult collect_gp(const std::string& dir, uint64_t seed, const SuiteRun& run);

// run name -> one result per seed (in the run's seed order), from <out>/final/<run>/seed-<seed>.
using SuiteResults = std::map<std::string, std::vector<SeedResult>>;
SuiteResults collect_results(const Suite& suite, const std::vector<RunPlan>& plans,
                             const std::string& out);

// A claim's metric of one seed (nullopt when it has none, or diverged): test_loss, val_loss,
// test_rmse, val_rmse, test_rmse_targets, text_loss:<name>, task_error:<task> (1 - acc),
// task_error_norm:<task> (1 - acc_norm), finetune_error:<name> (1 - the mean accuracy over the
// fine-tuning seeds; nullopt until every seed is in), or, with a `variant`, that variant's loss (GP:
// test RMSE at its T).
std::optional<double> metric_of(const SeedResult& r, const std::string& metric,
                                const std::string& variant);

}  // namespace cemfrac
