#include "cemfrac/compare/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "cemfrac/io/plot.h"
#include "cemfrac/compare/run_files.h"
#include "cemfrac/core/format_util.h"

namespace cemfrac {
using json = nlohmann::json;

std::string pm(const MeanSd& m, const char* fmt_spec) {
  if (m.n == 0) return "—";
  const std::string mean = fmt::format(fmt::runtime(fmt_spec), m.mean);
  if (m.n < 2) return mean;
  return mean + " ± " + fmt::format(fmt::runtime(fmt_spec), m.sd);
}

namespace {

// A table's seeds cell: the seeds planned, or "k of n" while a partial report has k of them.
std::string seeds_cell(size_t finished, size_t planned) {
  return finished == planned ? std::to_string(planned) : fmt::format("{} of {}", finished, planned);
}

// How the GP runs' depth and FFN are described: the suite's, unless some run names its own (then
// results.json gives each run's, and the text says where).
struct GpShape {
  bool one_depth = true;  // every run at [gp].layers
  bool own_ffn = false;   // some run names its own FFN
  std::string depth, ffn;
};

GpShape gp_shape(const std::vector<RunPlan>& plans, const SuiteGp& g) {
  std::set<int64_t> depths;
  GpShape s;
  for (const RunPlan& p : plans) {
    if (!p.gp) continue;
    depths.insert(p.run->gp.layers);
    s.own_ffn = s.own_ffn || p.run->gp.ffn != g.ffn;
  }
  s.one_depth = depths.size() <= 1 && (depths.empty() || *depths.begin() == g.layers);
  s.depth = s.one_depth ? fmt::format("L = {}", g.layers)
                        : fmt::format("L = {} by run (results.json: \"layers\")",
                                      fmt::join(depths, " or "));
  s.ffn = g.ffn.empty() && !s.own_ffn ? ""
          : s.own_ffn                 ? " (FFN by run, results.json: \"ffn\")"
                                      : ", attention-only (ffn = none)";
  return s;
}

// One GP run's row of the runs table, and its entry of results.json's "runs"; the oracle's RMSE
// against the targets when a seed has it.
std::string gp_run_row(const RunPlan& p, const std::vector<SeedResult>& rs, const SuiteGp& g,
                       const GpShape& shape, json& runs, std::optional<double>& oracle) {
  const SuiteRun& run = *p.run;
  const bool cem = run.gp.model == GpModelKind::kCem;
  std::vector<double> val, test, targets, rate;
  int diverged = 0;
  size_t finished = 0;
  json seeds = json::array();
  for (const SeedResult& r : rs) {
    if (r.diverged || r.test_rmse) ++finished;
    auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
    seeds.push_back({{"seed", r.seed},
                     {"diverged", r.diverged},
                     {"val_rmse", opt(r.val_rmse)},
                     {"test_rmse", opt(r.test_rmse)},
                     {"test_rmse_targets", opt(r.test_rmse_targets)},
                     {"variant_rmse", r.variant_loss},
                     {"train_s", r.train_s},
                     {"steps_per_s", r.tokens_per_s}});
    if (r.diverged) {
      ++diverged;
      continue;
    }
    if (r.val_rmse) val.push_back(*r.val_rmse);
    if (r.test_rmse) test.push_back(*r.test_rmse);
    if (r.test_rmse_targets) targets.push_back(*r.test_rmse_targets);
    if (r.tokens_per_s > 0) rate.push_back(r.tokens_per_s);
    if (r.oracle_rmse_targets) oracle = r.oracle_rmse_targets;
  }
  const std::string md = fmt::format(
      "| {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", run.name,
      diverged ? fmt::format(" ({} diverged)", diverged) : "", enum_name(run.gp.model),
      cem ? run.gp.variant : "–", cem ? std::to_string(run.gp.T) : "–", with_commas(p.params),
      with_commas(run.gp.steps), seeds_cell(finished, run.seeds.size()),
      p.lr > 0 ? lr_text(p.lr) + (run.lr_from.empty() ? "" : " (from " + run.lr_from + ")") : "—",
      pm(mean_sd(val), "{:.4f}"), pm(mean_sd(test), "{:.4f}"), pm(mean_sd(targets), "{:.4f}"),
      pm(mean_sd(rate), "{:.2f}"));
  json lrj = json::object();
  for (const auto& [k, v] : p.lr_search) lrj[k] = v ? json(*v) : json(nullptr);
  runs.push_back({{"name", run.name},
                  {"task", "gp"},
                  {"model", enum_name(run.gp.model)},
                  {"variant", cem ? json(run.gp.variant) : json(nullptr)},
                  {"T", cem ? json(run.gp.T) : json(nullptr)},
                  {"steps", run.gp.steps},
                  {"params", p.params},
                  {"lr", p.lr},
                  {"lr_from", run.lr_from},
                  {"lr_search", lrj},
                  {"seeds", seeds}});
  // Only where they vary, so that the results.json of earlier suites keep their exact keys.
  if (!shape.one_depth) runs.back()["layers"] = run.gp.layers;
  if (!g.ffn.empty() || shape.own_ffn)
    runs.back()["ffn"] = run.gp.ffn.empty() ? "default" : run.gp.ffn;
  return md;
}

// One row per GP run with test-time T, one column per evaluated T (the union over runs): the
// trained T's cell is the run's own test RMSE, in bold. "" when no run has any.
std::string gp_test_time_table(const std::vector<RunPlan>& plans,
                               std::map<std::string, std::vector<SeedResult>>& results) {
  std::set<int64_t> all_T;
  for (const RunPlan& p : plans)
    if (p.gp)
      for (const SuiteVariant& v : p.run->variants) all_T.insert(v.cem_steps);
  if (all_T.empty()) return "";
  std::string md =
      "### GP: evaluated at T (test RMSE, the weights trained at the run's T; bold: the trained "
      "T)\n\n| run | trained T |";
  for (const int64_t T : all_T) md += fmt::format(" T = {} |", T);
  md += "\n|---|---:|";
  for (size_t i = 0; i < all_T.size(); ++i) md += "---:|";
  md += "\n";
  for (const RunPlan& p : plans) {
    if (!p.gp || p.run->variants.empty()) continue;
    md += fmt::format("| {} | {} |", p.run->name, p.run->gp.T);
    for (const int64_t T : all_T) {
      const SuiteVariant* v = nullptr;
      for (const SuiteVariant& c : p.run->variants)
        if (c.cem_steps == T) v = &c;
      if (!v) {
        md += " |";
        continue;
      }
      std::vector<double> x;
      for (const SeedResult& r : results[p.run->name]) {
        auto it = r.variant_loss.find(v->name);
        if (!r.diverged && it != r.variant_loss.end()) x.push_back(it->second);
      }
      const std::string cell = pm(mean_sd(x), "{:.4f}");
      md += T == p.run->gp.T && !x.empty() ? " **" + cell + "** |" : " " + cell + " |";
    }
    md += "\n";
  }
  return md + "\n";
}

// The GP runs' table and their test-time table (markdown), and their entries of results.json's
// "runs" (appended to `runs`).
std::string gp_runs_section(const std::vector<RunPlan>& plans,
                            std::map<std::string, std::vector<SeedResult>>& results,
                            const Suite& suite, json& runs) {
  const SuiteGp& g = suite.gp;
  const GpShape shape = gp_shape(plans, g);
  std::string md = fmt::format(
      "## GP runs (in-context regression, docs/gp.md)\n\n"
      "{} sequences per step, {}{}, positions {}; validation set {} and test set {} sequences "
      "(eval seed {}: the same sets for every run and seed; the seed sets the init and the "
      "training batches). RMSE against the GP posterior mean unless marked; mean ± sample "
      "standard deviation over seeds.\n\n",
      g.batch, shape.depth, shape.ffn, g.positions, with_commas(g.val_seqs),
      with_commas(g.test_seqs), g.eval_seed);
  md +=
      "| run | model | variant | trained T | params | steps | seeds | lr | val RMSE | test RMSE | "
      "test RMSE vs targets | steps/s "
      "|\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  std::optional<double> oracle;
  for (const RunPlan& p : plans)
    if (p.gp) md += gp_run_row(p, results[p.run->name], g, shape, runs, oracle);
  md += "\n";
  if (oracle)
    md += fmt::format(
        "The oracle (the posterior mean itself) has RMSE {:.4f} against the noisy test targets: "
        "the floor of the \"vs targets\" column.\n\n",
        *oracle);
  return md + gp_test_time_table(plans, results);
}

// Test RMSE against T (log axis): per CEM reading, its runs trained at each T (evaluated at that
// T); per run with test-time steps, the same weights evaluated at each T (dashed in spirit: no
// band); the Llama baseline as a flat line over the range.
Plot gp_rmse_plot(const std::vector<RunPlan>& plans,
                  std::map<std::string, std::vector<SeedResult>>& results, const Suite& suite) {
  Plot plot;
  plot.title =
      fmt::format("{}: GP test RMSE against the posterior mean (± sd over seeds)", suite.name);
  plot.x_label = "CEM steps T";
  plot.y_label = "test RMSE";
  plot.log_x = true;
  auto stat = [&](const std::string& run, const std::string& variant) {
    std::vector<double> x;
    for (const SeedResult& r : results[run]) {
      if (r.diverged) continue;
      if (variant.empty() && r.test_rmse) x.push_back(*r.test_rmse);
      auto it = r.variant_loss.find(variant);
      if (!variant.empty() && it != r.variant_loss.end()) x.push_back(it->second);
    }
    return mean_sd(x);
  };
  auto add_point = [](PlotSeries& s, double x, const MeanSd& m) {
    s.x.push_back(x);
    s.y.push_back(m.n ? m.mean : std::nan(""));
    s.lo.push_back(m.mean - m.sd);
    s.hi.push_back(m.mean + m.sd);
  };
  std::vector<std::string> readings;
  int64_t t_lo = 1, t_hi = 1;
  for (const RunPlan& p : plans) {
    if (!p.gp || p.run->gp.model != GpModelKind::kCem) continue;
    if (std::find(readings.begin(), readings.end(), p.run->gp.variant) == readings.end())
      readings.push_back(p.run->gp.variant);
    t_hi = std::max(t_hi, p.run->gp.T);
    for (const SuiteVariant& v : p.run->variants) t_hi = std::max(t_hi, v.cem_steps);
  }
  std::set<int64_t> all_T;  // a tick at every T trained or evaluated
  for (const RunPlan& p : plans) {
    if (!p.gp || p.run->gp.model != GpModelKind::kCem) continue;
    all_T.insert(p.run->gp.T);
    for (const SuiteVariant& v : p.run->variants) all_T.insert(v.cem_steps);
  }
  for (const int64_t T : all_T) plot.x_ticks.push_back(static_cast<double>(T));
  for (const std::string& reading : readings) {
    std::vector<std::pair<int64_t, MeanSd>> points;
    for (const RunPlan& p : plans)
      if (p.gp && p.run->gp.model == GpModelKind::kCem && p.run->gp.variant == reading)
        points.emplace_back(p.run->gp.T, stat(p.run->name, ""));
    std::sort(points.begin(), points.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    PlotSeries s;
    s.name = reading + " trained at T";
    s.band = false;
    for (const auto& [T, m] : points) add_point(s, static_cast<double>(T), m);
    plot.series.push_back(s);
  }
  for (const RunPlan& p : plans) {
    if (!p.gp || p.run->variants.empty()) continue;
    PlotSeries s;
    s.name = fmt::format("{} (trained at T={}) evaluated at T", p.run->name, p.run->gp.T);
    s.band = false;
    for (const SuiteVariant& v : p.run->variants)
      add_point(s, static_cast<double>(v.cem_steps), stat(p.run->name, v.name));
    plot.series.push_back(s);
  }
  for (const RunPlan& p : plans) {
    if (!p.gp || p.run->gp.model != GpModelKind::kLlama) continue;
    PlotSeries s;
    s.name = p.run->name + " (llama baseline)";
    s.band = false;
    const MeanSd m = stat(p.run->name, "");
    add_point(s, static_cast<double>(t_lo), m);
    add_point(s, static_cast<double>(t_hi), m);
    plot.series.push_back(s);
  }
  return plot;
}

// The report's head: what was run, where and when; a partial report and runs that died say so.
std::string header_section(const Suite& suite, const json& provenance) {
  std::string md = fmt::format("# Suite `{}`\n\n{}\n\n", suite.name, suite.description);
  md += fmt::format(
      "**Command:** `{}`  \n**Machine:** {}  \n**Date:** {}  \n**Commit:** {}  \n"
      "**Wall time of this invocation:** {}\n\n",
      provenance.value("command", ""), provenance.value("machine", ""),
      provenance.value("date", ""), provenance.value("commit", ""),
      provenance.value("wall_time", ""));
  const int64_t n_final = provenance.value("final_runs", int64_t{0});
  const int64_t n_done = provenance.value("final_runs_finished", int64_t{0});
  if (n_done < n_final)
    md += fmt::format(
        "**Partial report:** {} of {} final runs are trained and evaluated; the others show — "
        "and the claims use the seeds finished so far. Run the same command without --report "
        "to go on.\n\n",
        n_done, n_final);
  const json died = provenance.value("runs_died", json::array());
  if (!died.empty()) {
    std::vector<std::string> names;
    for (const json& d : died) names.push_back("`" + d.get<std::string>() + "`");
    md += fmt::format(
        "**Died:** {} (summary.json says running, but no process holds the run: it was killed "
        "outright). Run the same command without --report to resume {}.\n\n",
        fmt::format("{}", fmt::join(names, ", ")), died.size() == 1 ? "it" : "them");
  }
  return md;
}

json optional_json(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}

json lr_search_json(const RunPlan& p) {
  json lrj = json::object();
  for (const auto& [k, v] : p.lr_search) lrj[k] = optional_json(v);
  return lrj;
}

std::string lr_cell(const RunPlan& p) {
  return p.lr > 0 ? lr_text(p.lr) + (p.run->lr_from.empty() ? "" : " (from " + p.run->lr_from + ")")
                  : "—";
}

// One LM run's row of the runs table (markdown), its entry of results.json's "runs", and notes on
// seeds whose final validation loss is above their best.
std::string lm_run_row(const RunPlan& p, const std::vector<SeedResult>& rs, const Suite& suite,
                       int64_t train_split_tokens, json& runs, std::vector<std::string>& notes) {
  std::vector<double> val, test, ppl, bpb, rate;
  std::map<std::string, std::vector<double>> text;
  int diverged = 0;
  size_t finished = 0;
  json seeds = json::array();
  const bool downstream = !suite.tasks.empty() || !suite.finetunes.empty();
  for (const SeedResult& r : rs) {
    if (r.diverged || r.test_loss) ++finished;
    seeds.push_back({{"seed", r.seed},
                     {"diverged", r.diverged},
                     {"tokens_per_s", r.tokens_per_s},
                     {"train_s", r.train_s},
                     {"val_loss", optional_json(r.val_loss)},
                     {"best_val_loss", optional_json(r.best_val_loss)},
                     {"test_loss", optional_json(r.test_loss)},
                     {"test_perplexity", optional_json(r.test_ppl)},
                     {"test_bits_per_byte", optional_json(r.test_bpb)},
                     {"text_loss", r.text_loss},
                     {"variant_loss", r.variant_loss},
                     {"val_curve", r.val_curve}});
    if (downstream) {  // absent otherwise: earlier suites' results.json stay as they were
      seeds.back()["task_acc"] = r.task_acc;
      seeds.back()["task_acc_norm"] = r.task_acc_norm;
      seeds.back()["finetune_acc"] = r.finetune_acc;
      seeds.back()["task_chance"] = r.task_chance;
      seeds.back()["finetune_majority"] = r.finetune_majority;
    }
    if (r.diverged) {
      ++diverged;
      continue;
    }
    if (r.val_loss) val.push_back(*r.val_loss);
    if (r.test_loss) test.push_back(*r.test_loss);
    if (r.test_ppl) ppl.push_back(*r.test_ppl);
    if (r.test_bpb) bpb.push_back(*r.test_bpb);
    for (const auto& [k, v] : r.text_loss) text[k].push_back(v);
    if (r.tokens_per_s > 0) rate.push_back(r.tokens_per_s);  // a seed not trained yet has none
    if (r.val_loss && r.best_val_loss && *r.val_loss > *r.best_val_loss + 0.01)
      notes.push_back(
          fmt::format("{} seed {}: final validation loss {:.3f} is above its best {:.3f} "
                      "(overfitting or instability)",
                      p.run->name, r.seed, *r.val_loss, *r.best_val_loss));
  }
  const int64_t tokens = ((p.run->tokens + p.per_step - 1) / p.per_step) * p.per_step;
  const double epochs = train_split_tokens > 0
                            ? static_cast<double>(tokens) / static_cast<double>(train_split_tokens)
                            : 0;
  std::string md = fmt::format(
      "| {}{} | {} | {} ({:.2f}) | {} | {} | {} | {} | {} | {} |", p.run->name,
      diverged ? fmt::format(" ({} diverged)", diverged) : "", with_commas(p.params),
      with_commas(tokens), epochs, seeds_cell(finished, p.run->seeds.size()), lr_cell(p),
      pm(mean_sd(val)), pm(mean_sd(test)), pm(mean_sd(ppl), "{:.1f}"), pm(mean_sd(bpb)));
  for (const std::string& t : suite.eval_text) md += " " + pm(mean_sd(text[stem(t)])) + " |";
  md += " " + pm(mean_sd(rate), "{:.0f}") + " |\n";
  runs.push_back({{"name", p.run->name},
                  {"config", p.run->config},
                  {"set", p.run->sets},
                  {"params", p.params},
                  {"tokens", tokens},
                  {"epochs", epochs},
                  {"lr", p.lr},
                  {"lr_from", p.run->lr_from},
                  {"lr_search", lr_search_json(p)},
                  {"seeds", seeds}});
  return md;
}

// The LM runs' table and its notes; their entries of results.json's "runs" go to `runs`.
std::string lm_runs_section(const Suite& suite, const std::vector<RunPlan>& plans,
                            SuiteResults& results, int64_t train_split_tokens, json& runs) {
  std::string md = fmt::format(
      "Data: `{}` (training split {} tokens); final numbers on the `{}` split. Loss in nats "
      "per token; mean ± sample standard deviation over seeds.\n\n",
      suite.data, with_commas(train_split_tokens), suite.eval_split);
  md += "## Runs\n\n| run | params | tokens (epochs) | seeds | lr | val loss | " +
        suite.eval_split + " loss | " + suite.eval_split + " ppl | " + suite.eval_split +
        " bits/byte |";
  for (const std::string& t : suite.eval_text) md += fmt::format(" {} loss |", stem(t));
  md += " tokens/s (median step) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|";
  for (size_t i = 0; i < suite.eval_text.size(); ++i) md += "---:|";
  md += "---:|\n";
  std::vector<std::string> notes;
  for (const RunPlan& p : plans)
    if (!p.gp) md += lm_run_row(p, results[p.run->name], suite, train_split_tokens, runs, notes);
  md += "\n";
  for (const std::string& n : notes) md += "- " + n + "\n";
  if (!notes.empty()) md += "\n";
  return md;
}

// The learning-rate grids of the LM runs (gp = false: final validation loss) or of the GP runs
// (validation RMSE); "" when no run of that task searched.
std::string lr_search_section(const Suite& suite, const std::vector<RunPlan>& plans, bool gp) {
  bool any = false;
  for (const RunPlan& p : plans) any = any || (p.gp == gp && !p.lr_search.empty());
  if (!any) return "";
  std::string md =
      gp ? fmt::format(
               "## GP learning-rate search ({} steps, first seed, validation RMSE against the "
               "posterior mean; the test set plays no part)\n\n| run | lr: val RMSE |\n|---|---|\n",
               with_commas(suite.gp.search_steps))
         : fmt::format(
               "## Learning-rate search ({} tokens, first seed, final validation loss)\n\n| run | "
               "lr: val loss |\n|---|---|\n",
               with_commas(suite.lr_search_tokens));
  for (const RunPlan& p : plans) {
    if (p.gp != gp || p.lr_search.empty()) continue;
    std::string cells;
    for (const auto& [k, v] : p.lr_search)
      cells +=
          fmt::format("{}{}: {}", cells.empty() ? "" : ", ", k,
                      v ? fmt::format(fmt::runtime(gp ? "{:.4f}" : "{:.3f}"), *v) : "diverged");
    md += fmt::format("| {} | {} ({}) |\n", p.run->name, cells,
                      p.lr > 0 ? "chose " + lr_text(p.lr) : "not chosen yet");
  }
  return md + "\n";
}

// The LM runs' test-time variants on the evaluation split; "" when none has any.
std::string variants_section(const Suite& suite, const std::vector<RunPlan>& plans,
                             SuiteResults& results) {
  bool any = false;
  for (const RunPlan& p : plans) any = any || (!p.gp && !p.run->variants.empty());
  if (!any) return "";
  std::string md =
      fmt::format("## Test-time variants ({} split, same checkpoints)\n\n", suite.eval_split);
  md += "| run | variant | set | loss | perplexity |\n|---|---|---|---:|---:|\n";
  for (const RunPlan& p : plans) {
    if (p.gp) continue;
    for (const SuiteVariant& v : p.run->variants) {
      std::vector<double> l, pp;
      for (const SeedResult& r : results[p.run->name]) {
        auto it = r.variant_loss.find(v.name);
        if (it == r.variant_loss.end() || r.diverged) continue;
        l.push_back(it->second);
        pp.push_back(std::exp(it->second));
      }
      std::string sets;
      for (const std::string& s : v.sets) sets += (sets.empty() ? "" : " ") + s;
      md += fmt::format("| {} | {} | `{}` | {} | {} |\n", p.run->name, v.name, sets, pm(mean_sd(l)),
                        pm(mean_sd(pp), "{:.1f}"));
    }
  }
  return md + "\n";
}

// Zero-shot task accuracies and fine-tuning accuracies of the LM runs (mean ± sd over the
// pre-training seeds; a fine-tuning's value per pre-training seed is the mean over its fine-tuning
// seeds); "" when the suite has neither.
std::string downstream_section(const Suite& suite, const std::vector<RunPlan>& plans,
                               SuiteResults& results) {
  if (suite.tasks.empty() && suite.finetunes.empty()) return "";
  std::string md =
      "## Downstream (accuracy; mean ± sd over pre-training seeds)\n\nZero-shot: `cemfrac eval "
      "--task` (acc; acc_norm for multiple choice, lm-evaluation-harness's definitions). "
      "Fine-tuning: `cemfrac finetune`, accuracy on the task's test set (else its first "
      "evaluation set), averaged over the fine-tuning seeds of each pre-trained model.\n\n| run |";
  std::string rule = "|---|";
  for (const std::string& t : suite.tasks) {
    md += fmt::format(" {} acc | {} acc_norm |", task_key(t), task_key(t));
    rule += "---:|---:|";
  }
  for (const SuiteFinetune& f : suite.finetunes) {
    md += fmt::format(" ft {} ({}, {} seeds) |", f.name, f.task, f.seeds.size());
    rule += "---:|";
  }
  md += "\n" + rule + "\n";
  for (const RunPlan& p : plans) {
    if (p.gp) continue;
    md += "| " + p.run->name + " |";
    for (const std::string& t : suite.tasks) {
      std::vector<double> acc, norm;
      for (const SeedResult& r : results[p.run->name]) {
        if (auto a = metric_of(r, "task_error:" + task_key(t), "")) acc.push_back(1 - *a);
        if (auto a = metric_of(r, "task_error_norm:" + task_key(t), "")) norm.push_back(1 - *a);
      }
      md += fmt::format(" {} | {} |", pm(mean_sd(acc)), norm.empty() ? "—" : pm(mean_sd(norm)));
    }
    for (const SuiteFinetune& f : suite.finetunes) {
      std::vector<double> acc;
      for (const SeedResult& r : results[p.run->name])
        if (auto e = metric_of(r, "finetune_error:" + f.name, "")) acc.push_back(1 - *e);
      md += " " + pm(mean_sd(acc)) + " |";
    }
    md += "\n";
  }
  // The floors each accuracy has to clear, from any seed that has them.
  std::map<std::string, double> chance, majority;
  for (const auto& [name, rs] : results)
    for (const SeedResult& r : rs) {
      chance.insert(r.task_chance.begin(), r.task_chance.end());
      majority.insert(r.finetune_majority.begin(), r.finetune_majority.end());
    }
  std::string floors;
  for (const auto& [task, c] : chance) floors += fmt::format("; {} chance {:.3f}", task, c);
  for (const auto& [name, m] : majority)
    floors += fmt::format("; ft {} majority class {:.3f}", name, m);
  if (!floors.empty()) md += "\nFloors:" + floors.substr(1) + ".\n";
  return md + "\n";
}

// One row `a` of claim `c` against its b, paired over the seeds both have: the markdown row, its
// results.json pair and its verdict.
Verdict claim_pair(const SuiteClaim& c, const std::string& a, SuiteResults& results,
                   std::string& rows, json& pairs) {
  const auto [an, av] = split_row(a);
  const auto [bn, bv] = split_row(c.b);
  std::vector<double> xa, xb;
  std::vector<uint64_t> used;
  for (const SeedResult& ra : results[an]) {
    for (const SeedResult& rb : results[bn]) {
      if (ra.seed != rb.seed) continue;
      const auto va = metric_of(ra, c.metric, av), vb = metric_of(rb, c.metric, bv);
      if (!va || !vb) continue;
      xa.push_back(*va);
      xb.push_back(*vb);
      used.push_back(ra.seed);
    }
  }
  const PairedDiff d = paired_difference(xa, xb);
  const Verdict v = d.diff.n == 0 ? Verdict::kInconclusive : verdict(d, c.test, c.margin);
  pairs.push_back({{"a", a},
                   {"b", c.b},
                   {"seeds", used},
                   {"a_values", xa},
                   {"b_values", xb},
                   {"mean_diff", d.diff.mean},
                   {"sd_diff", d.diff.sd},
                   {"n", d.diff.n},
                   {"lo", d.has_interval ? json(d.lo) : json(nullptr)},
                   {"hi", d.has_interval ? json(d.hi) : json(nullptr)},
                   {"verdict", to_string(v)}});
  const std::string test =
      c.test == ClaimTest::kBetter ? "better" : fmt::format("not_worse (m = {:g})", c.margin);
  rows += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", c.id, a, c.b, c.metric,
                      test, d.diff.n ? fmt::format("{:+.4f}", d.diff.mean) : "—",
                      d.has_interval ? fmt::format("[{:+.4f}, {:+.4f}]", d.lo, d.hi) : "—",
                      d.diff.n, to_string(v));
  return v;
}

// The claims: every pair's difference, interval and verdict, then each claim's statement and
// overall verdict; their results.json entries go to `claims`. "" without claims.
std::string claims_section(const Suite& suite, SuiteResults& results, json& claims) {
  if (suite.claims.empty()) return "";
  const bool has_lm = suite.has_task(SuiteTask::kLm), has_gp = suite.has_task(SuiteTask::kGp);
  std::string unit = !has_gp  ? "nats per token"
                     : has_lm ? "nats per token; RMSE for GP rows"
                              : "RMSE";
  for (const SuiteClaim& c : suite.claims)
    if (!downstream_metric(c.metric).first.empty()) {
      unit += "; error rate, 1 − accuracy, for task_error and finetune_error rows";
      break;
    }
  std::string md =
      "## Claims\n\nd = a − b of the metric (" + unit +
      ", lower is better), paired over the seeds both rows share; 95% interval from Student's t "
      "with n − 1 degrees of freedom. `better`: supported when the interval lies below 0, "
      "contradicted when above 0; `not_worse` (margin m): supported when below +m, contradicted "
      "when above +m; otherwise, or with fewer than 2 seeds, inconclusive.\n\n"
      "| claim | a | b | metric | test | d (mean) | 95% interval | n | verdict |\n"
      "|---|---|---|---|---|---:|---|---:|---|\n";
  for (const SuiteClaim& c : suite.claims) {
    std::vector<Verdict> vs;
    json pairs = json::array();
    for (const std::string& a : c.a) vs.push_back(claim_pair(c, a, results, md, pairs));
    claims.push_back({{"id", c.id},
                      {"text", c.text},
                      {"source", c.source},
                      {"test", enum_name(c.test)},
                      {"margin", c.margin},
                      {"metric", c.metric},
                      {"pairs", pairs},
                      {"verdict", to_string(combine(vs))}});
  }
  md += "\n| claim | statement | source | verdict |\n|---|---|---|---|\n";
  for (const json& c : claims)
    md += fmt::format("| {} | {} | {} | **{}** |\n", c["id"].get<std::string>(),
                      c["text"].get<std::string>(), c["source"].get<std::string>(),
                      c["verdict"].get<std::string>());
  return md + "\n";
}

// Validation loss against training tokens, one curve per LM run (band: ± sd over seeds).
Plot val_loss_plot(const Suite& suite, const std::vector<RunPlan>& lm_plans,
                   SuiteResults& results) {
  Plot val;
  val.title =
      fmt::format("{}: validation loss during training (band: ± sd over seeds)", suite.name);
  val.x_label = "training tokens";
  val.y_label = "validation loss (nats/token)";
  for (const RunPlan& p : lm_plans) {
    PlotSeries s;
    s.name = p.run->name;
    std::map<double, std::vector<double>> at;
    for (const SeedResult& r : results[p.run->name])
      if (!r.diverged)
        for (const auto& [t, v] : r.val_curve) at[t].push_back(v);
    for (const auto& [t, v] : at) {
      const MeanSd m = mean_sd(v);
      s.x.push_back(t);
      s.y.push_back(m.mean);
      s.lo.push_back(m.mean - m.sd);
      s.hi.push_back(m.mean + m.sd);
    }
    val.series.push_back(s);
  }
  return val;
}

// The evaluation split's perplexity per LM run (bars) and against the run's parameters.
std::pair<Plot, Plot> perplexity_plots(const Suite& suite, const std::vector<RunPlan>& lm_plans,
                                       SuiteResults& results) {
  Plot ppl;
  ppl.title =
      fmt::format("{}: {} perplexity (error bars: ± sd over seeds)", suite.name, suite.eval_split);
  ppl.y_label = suite.eval_split + " perplexity";
  Plot pvp;
  pvp.title = fmt::format("{}: parameters against {} perplexity", suite.name, suite.eval_split);
  pvp.x_label = "parameters";
  pvp.y_label = suite.eval_split + " perplexity";
  PlotSeries bars;
  bars.name = suite.eval_split + " perplexity";
  bars.line = false;
  bars.band = false;
  for (size_t i = 0; i < lm_plans.size(); ++i) {
    std::vector<double> v;
    for (const SeedResult& r : results[lm_plans[i].run->name])
      if (!r.diverged && r.test_ppl) v.push_back(*r.test_ppl);
    const MeanSd m = mean_sd(v);
    ppl.categories.push_back(lm_plans[i].run->name);
    const double y = m.n ? m.mean : std::nan("");
    bars.x.push_back(static_cast<double>(i));
    bars.y.push_back(y);
    bars.lo.push_back(y - m.sd);
    bars.hi.push_back(y + m.sd);
    PlotSeries pt;
    pt.name = lm_plans[i].run->name;
    pt.line = false;
    pt.band = false;
    pt.x = {static_cast<double>(lm_plans[i].params)};
    pt.y = {y};
    pt.lo = {y - m.sd};
    pt.hi = {y + m.sd};
    pvp.series.push_back(pt);
  }
  ppl.series.push_back(bars);
  return {ppl, pvp};
}

// Perplexity against the CEM steps T at test time, one curve per run with T variants (no series
// when none has any).
Plot cem_steps_plot(const Suite& suite, const std::vector<RunPlan>& lm_plans,
                    SuiteResults& results) {
  Plot steps;
  steps.title = fmt::format("{}: CEM steps T at test time ({} perplexity, ± sd over seeds)",
                            suite.name, suite.eval_split);
  steps.x_label = "model.cem.steps at evaluation";
  steps.y_label = suite.eval_split + " perplexity";
  steps.log_x = true;
  std::set<int64_t> steps_T;  // a tick at every T evaluated
  for (const RunPlan& p : lm_plans)
    for (const SuiteVariant& v : p.run->variants)
      if (v.cem_steps > 0) steps_T.insert(v.cem_steps);
  for (const int64_t T : steps_T) steps.x_ticks.push_back(static_cast<double>(T));
  for (const RunPlan& p : lm_plans) {
    PlotSeries s;
    s.name = p.run->name;
    for (const SuiteVariant& v : p.run->variants) {
      if (v.cem_steps <= 0) continue;
      std::vector<double> pp;
      for (const SeedResult& r : results[p.run->name]) {
        auto it = r.variant_loss.find(v.name);
        if (!r.diverged && it != r.variant_loss.end()) pp.push_back(std::exp(it->second));
      }
      const MeanSd m = mean_sd(pp);
      s.x.push_back(static_cast<double>(v.cem_steps));
      s.y.push_back(m.n ? m.mean : std::nan(""));
      s.lo.push_back(m.mean - m.sd);
      s.hi.push_back(m.mean + m.sd);
    }
    s.band = false;
    if (!s.x.empty()) steps.series.push_back(s);
  }
  return steps;
}

// Every plot of the report, by file name.
std::map<std::string, std::string> plots(const Suite& suite, const std::vector<RunPlan>& plans,
                                         SuiteResults& results) {
  std::map<std::string, std::string> out;
  if (suite.has_task(SuiteTask::kGp))
    out["gp_rmse_vs_T.svg"] = to_svg(gp_rmse_plot(plans, results, suite));
  if (!suite.has_task(SuiteTask::kLm)) return out;
  std::vector<RunPlan> lm_plans;  // the plots below are of the LM runs only
  for (const RunPlan& p : plans)
    if (!p.gp) lm_plans.push_back(p);
  out["val_loss.svg"] = to_svg(val_loss_plot(suite, lm_plans, results));
  const auto [ppl, pvp] = perplexity_plots(suite, lm_plans, results);
  out["perplexity.svg"] = to_svg(ppl);
  out["params_vs_perplexity.svg"] = to_svg(pvp);
  const Plot steps = cem_steps_plot(suite, lm_plans, results);
  if (!steps.series.empty()) out["cem_test_time_steps.svg"] = to_svg(steps);
  return out;
}

}  // namespace

Report make_report(const Suite& suite, const std::vector<RunPlan>& plans, SuiteResults results,
                   int64_t train_split_tokens, const json& provenance) {
  Report rep;
  json& J = rep.results;
  J["suite"] = suite.name;
  J["suite_file"] = suite.path;
  J["description"] = suite.description;
  J["provenance"] = provenance;
  J["data"] = suite.data;
  J["eval_split"] = suite.eval_split;
  J["train_split_tokens"] = train_split_tokens;

  std::string md = header_section(suite, provenance);
  json runs = json::array();
  if (suite.has_task(SuiteTask::kLm))
    md += lm_runs_section(suite, plans, results, train_split_tokens, runs);
  if (suite.has_task(SuiteTask::kGp)) md += gp_runs_section(plans, results, suite, runs);
  J["runs"] = runs;
  md += lr_search_section(suite, plans, false);
  md += lr_search_section(suite, plans, true);
  md += variants_section(suite, plans, results);
  md += downstream_section(suite, plans, results);
  json claims = json::array();
  md += claims_section(suite, results, claims);
  J["claims"] = claims;
  rep.plots = plots(suite, plans, results);
  md += "## Plots\n\n";
  for (const auto& [name, svg] : rep.plots) md += fmt::format("- [{}](plots/{})\n", name, name);
  md += "\n";
  rep.markdown = md;
  return rep;
}

}  // namespace cemfrac
