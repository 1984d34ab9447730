// cemfrac gp: the CEM paper's synthetic experiment, Gaussian-process in-context regression, RMSE
// against the recursion depth T (docs/gp.md).
//
//   cemfrac gp [--steps 1,2,4,8] [--variants fixed,iterate,...] [--train-steps N] [--batch B] [--lr
//   X] [--eval-seqs S] [--layers L]
//              [--positions none|rope] [--ffn none] [--scale-from T] [--no-baseline] [--seed S] [--out DIR]
//              [--json] [--quick]
//   cemfrac gp --replot runs/gp/gp.json [--out DIR]      # redraw the SVG of a finished run
//   cemfrac gp --one [--model cem|llama] [--variants V] [--steps T] [--eval-steps 1,2,4,8]
//              [--train-steps N] [--lr X] [--seed S] [--eval-seed E] [--val-seqs V]
//              [--eval-seqs S] [--out DIR] [--checkpoint-dir DIR]
//              # one model, its result as one JSON object (the GP job of `cemfrac compare`,
//              # docs/compare.md); --checkpoint-dir makes its training resumable
//
// Trains one CEM model per T (trained and tested at that T), evaluates the model trained at
// --scale-from at every other T, trains the Llama baseline (mha + swiglu, same D, H, L, M), and
// prints RMSE against the noisy targets and against the exact GP posterior mean (the oracle floor),
// with parameters and times. Writes <out>/gp.json and <out>/gp-rmse.svg.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/blas.h"  // set_threads
#include "cemfrac/core/check.h"
#include "cemfrac/core/dir_lock.h"
#include "cemfrac/tasks/gp_experiment.h"
#include "cemfrac/train/trainer.h"  // TrainingInterrupted
#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "cemfrac/core/format_util.h"
#include "cli/device_util.h"

namespace cemfrac::cli {
namespace {

std::string t_text(int64_t T) {
  return T > 0 ? std::to_string(T) : "-";
}

void print_table(const GpExperimentResult& r, const GpExperimentOptions& o) {
  fmt::print(
      "GP in-context regression: {} points per sequence, l ~ LogU[{}, {}], noise {}; D = {}, "
      "H = {}, L = {}, M = {}, positions {}\n",
      o.task.n_points, o.task.lengthscale_min, o.task.lengthscale_max, o.task.noise_std,
      o.cem_model.d_model, o.cem_model.n_heads, o.cem_model.n_layers, o.cem_model.d_ff,
      enum_name(o.cem_model.positions));
  fmt::print(
      "{} training steps x {} fresh sequences, lr {}; held-out set: {} sequences ({} "
      "targets), seed {}\n\n",
      r.train_steps, r.batch, o.train.lr_max, r.eval_seqs, r.eval_seqs * (r.n_points - 1), r.seed);
  fmt::print("{:<8}  {:<16}  {:>9}  {:>5}  {:>17}  {:>17}  {:>9}  {:>8}  {:>6}\n", "model",
             "variant", "trained T", "run T", "RMSE vs targets", "RMSE vs post. mean", "params",
             "train s", "eval s");
  for (const GpRow& row : r.rows) {
    if (row.model == "oracle") {
      fmt::print("{:<8}  {:<16}  {:>9}  {:>5}  {:>8.4f} ± {:.4f}  {:>17}  {:>9}  {:>8}  {:>6}\n",
                 row.model, "-", "-", "-", row.eval.rmse_targets, row.eval.se_targets, "0 (itself)",
                 "-", "-", "-");
      continue;
    }
    fmt::print(
        "{:<8}  {:<16}  {:>9}  {:>5}  {:>8.4f} ± {:.4f}  {:>8.4f} ± {:.4f}  {:>9}  {:>8}  "
        "{:>6.1f}\n",
        row.model, row.variant.empty() ? "-" : row.variant, t_text(row.train_T), t_text(row.eval_T),
        row.eval.rmse_targets, row.eval.se_targets, row.eval.rmse_posterior, row.eval.se_posterior,
        with_commas(row.params), row.train_s > 0 ? fmt::format("{:.1f}", row.train_s) : "-",
        row.eval.seconds);
  }
  if (r.val_seqs > 0) {
    fmt::print("\nvalidation set ({} sequences, its own stream; choose --lr on these):\n",
               r.val_seqs);
    fmt::print("{:<8}  {:<16}  {:>9}  {:>5}  {:>15}  {:>18}\n", "model", "variant", "trained T",
               "run T", "RMSE vs targets", "RMSE vs post. mean");
    for (const GpRow& row : r.rows) {
      if (!row.val) continue;
      fmt::print("{:<8}  {:<16}  {:>9}  {:>5}  {:>15.4f}  {:>18.4f}\n", row.model,
                 row.variant.empty() ? "-" : row.variant, t_text(row.train_T), t_text(row.eval_T),
                 row.val->rmse_targets, row.val->rmse_posterior);
    }
  }
  fmt::print(
      "\n± is one standard error over held-out sequences; every model sees the same training "
      "batches and starts from the same seed. Total {:.1f} s.\n",
      r.seconds);
}

// The flags of `cemfrac gp`.
struct GpFlags {
  std::vector<int64_t> steps = {1, 2, 4, 8};
  std::vector<std::string> variants = {"fixed"};
  int64_t train_steps = 0;
  int64_t batch = 0;
  double lr = 0;
  int64_t eval_seqs = 0;
  int64_t layers = 0;
  std::string positions = "none";
  std::string ffn;  // "" = each model's own (cem_mlp, swiglu); "none" = attention-only
  int64_t scale_from = 2;
  bool no_baseline = false;
  uint64_t seed = 1;
  std::string out;
  bool json = false;
  bool quick = false;
  std::string replot;
  int64_t val_seqs = -1;  // -1: the mode's default (experiment: none; --one: 256)
  bool one = false;
  std::string model = "cem";
  std::vector<int64_t> eval_steps;
  uint64_t eval_seed = 1;
  std::string checkpoint_dir;
};

// Which flags were given (their defaults say nothing).
struct GpGiven {
  bool steps = false, variants = false, eval_seqs = false;
};

// --replot: redraws the SVG of a finished experiment from its gp.json.
int replot_gp(const GpFlags& f) {
  const std::string source = f.replot;
  const GpExperimentResult saved =
      gp_result_from_json(nlohmann::json::parse(read_file(source), nullptr, false), source);
  const std::filesystem::path dir =
      f.out.empty() ? std::filesystem::path(source).parent_path() : std::filesystem::path(f.out);
  const std::string svg = (dir / "gp-rmse.svg").string();
  write_file_atomic(svg, gp_rmse_svg(saved));
  fmt::print("Wrote {}\n", svg);
  return 0;
}

// The experiment's options from the flags (both modes start from them).
GpExperimentOptions gp_options(const GpFlags& f, const GlobalOptions& global) {
  GpExperimentOptions o = default_gp_experiment();
  o.device = command_device(global);
  o.steps = f.steps;
  o.variants = f.variants;
  if (f.quick) o.train.steps = 60;
  if (f.train_steps > 0) o.train.steps = f.train_steps;
  if (f.batch > 0) o.train.batch = f.batch;
  if (f.lr > 0) o.train.lr_max = f.lr;
  o.train.lr_min = o.train.lr_max / 10;
  o.train.warmup_steps = std::max<int64_t>(1, o.train.steps / 20);
  o.train.progress = true;
  if (f.layers > 0) o.cem_model.n_layers = o.baseline.n_layers = f.layers;
  o.cem_model.positions = o.baseline.positions = parse_enum<Positions>(f.positions, "--positions");
  if (!f.ffn.empty()) o.cem_model.ffn = o.baseline.ffn = f.ffn;
  return o;
}

// --one: one model, trained and evaluated, its result as one JSON object (and <out>/gp-run.json).
int run_gp_one(const GpFlags& f, const GpExperimentOptions& o, const GpGiven& given) {
  GpRunOptions one;
  one.device = o.device;
  one.task = o.task;
  one.train = o.train;
  one.train.throw_on_nonfinite = false;  // a diverged run is a result ("status": "diverged")
  one.train.label = f.model == "llama" ? "gp llama" : "gp cem";
  if (f.model == "llama") {
    CEMFRAC_CHECK(!given.steps && !given.variants && f.eval_steps.empty(),
                  "gp --one --model llama: --steps, --variants and --eval-steps are for CEM");
    one.model = o.baseline;
  } else {
    CEMFRAC_CHECK(given.steps && f.steps.size() == 1,
                  "gp --one trains one CEM model: give its T as one --steps value");
    CEMFRAC_CHECK(f.variants.size() == 1,
                  "gp --one trains one CEM model: give at most one --variants value");
    one.model = o.cem_model;
    apply_gp_variant(one.model, f.variants[0]);
    one.model.cem.steps = f.steps[0];
    one.train.label = fmt::format("gp cem {} T={}", f.variants[0], f.steps[0]);
  }
  one.eval_steps = f.eval_steps;
  one.val_seqs = f.val_seqs >= 0 ? f.val_seqs : 256;
  one.test_seqs = given.eval_seqs ? f.eval_seqs : 1024;
  one.seed = f.seed;
  one.eval_seed = f.eval_seed;
  one.checkpoint_run_dir = f.checkpoint_dir;
  // One writer per directory (core/dir_lock.h): the trainer locks --checkpoint-dir; --out is
  // locked here unless it is that same directory (a second lock on it would refuse us).
  DirLock out_lock;
  std::error_code ec1, ec2;
  if (!f.out.empty() &&
      (f.checkpoint_dir.empty() || std::filesystem::weakly_canonical(f.out, ec1) !=
                                       std::filesystem::weakly_canonical(f.checkpoint_dir, ec2)))
    out_lock = DirLock::acquire(f.out, "gp");
  GpRunResult result;
  try {
    result = run_gp_single(one);
  } catch (const TrainingInterrupted& e) {
    fmt::print(stderr, "cemfrac: {}\n", e.what());
    return kExitInterrupted;  // as `train`: a checkpoint was saved
  }
  const nlohmann::json j = to_json(result, one);
  if (!f.out.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(f.out, ec);
    CEMFRAC_CHECK(!ec, "cannot create --out directory {}: {}", f.out, ec.message());
    write_file_atomic((std::filesystem::path(f.out) / "gp-run.json").string(), j.dump(2) + "\n");
  }
  fmt::print("{}\n", j.dump(2));
  return 0;
}

// The experiment: every T and variant, the baseline and the oracle; gp.json, gp-rmse.svg and the
// table (or the JSON).
int run_gp_experiment_command(const GpFlags& f, GpExperimentOptions o, const GpGiven& given) {
  o.eval_seqs = given.eval_seqs ? f.eval_seqs : (f.quick ? 256 : 1024);
  o.val_seqs = std::max<int64_t>(0, f.val_seqs);
  o.scale_from = f.scale_from;
  o.run_baseline = !f.no_baseline;
  o.seed = f.seed;
  const std::string out = !f.out.empty() ? f.out : (f.quick ? "runs/gp-quick" : "runs/gp");
  // Held for the whole experiment, so a second `gp` into the same --out is refused at once rather
  // than after its minutes of training.
  const DirLock out_lock = DirLock::acquire(out, "gp");
  const GpExperimentResult result = run_gp_experiment(o);
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  CEMFRAC_CHECK(!ec, "cannot create --out directory {}: {}", out, ec.message());
  const nlohmann::json j = to_json(result);
  write_file_atomic((std::filesystem::path(out) / "gp.json").string(), j.dump(2) + "\n");
  write_file_atomic((std::filesystem::path(out) / "gp-rmse.svg").string(), gp_rmse_svg(result));
  if (f.json) {
    fmt::print("{}\n", j.dump(2));
  } else {
    print_table(result, o);
    fmt::print("Wrote {0}/gp.json and {0}/gp-rmse.svg\n", out);
  }
  return 0;
}

}  // namespace

// The flags, one declaration each (which makes this function long), then the mode they choose.
Command add_gp(CLI::App& root, const GlobalOptions& global) {
  auto flags = std::make_shared<GpFlags>();
  CLI::App* app = root.add_subcommand(
      "gp",
      "CEM synthetic experiment: Gaussian-process in-context regression, RMSE against T (one "
      "thread unless --threads is given)");
  app->add_option("--steps", flags->steps,
                  "CEM step counts T, each trained and tested (e.g. 1,2,4,8)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app->add_option(
         "--variants", flags->variants,
         "CEM readings, each trained at every T: fixed (default), or '+'-joined iterate, "
         "prox, prox_fixed, step_norm, linear (e.g. fixed,iterate,prox,step_norm,iterate+prox; "
         "docs/gp.md)")
      ->delimiter(',');
  app->add_option("--train-steps", flags->train_steps,
                  "Optimizer steps per training (default 500; --quick: 60)")
      ->check(CLI::Range(int64_t{1}, int64_t{10000000}));
  app->add_option("--batch", flags->batch, "Fresh sequences per step (default 16)")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  app->add_option("--lr", flags->lr, "Peak learning rate (default 2e-3; cosine to a tenth)")
      ->check(CLI::Range(1e-7, 1.0));
  app->add_option("--eval-seqs", flags->eval_seqs,
                  "Held-out (test) sequences (default 1024; --quick: 256; --one: 0 = no test)")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  app->add_option("--layers", flags->layers, "Blocks L of every model (default 2)")
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  app->add_option("--positions", flags->positions, "Positions: none (default) | rope")
      ->check(CLI::IsMember({"none", "rope"}));
  app->add_option("--ffn", flags->ffn,
                  "none: attention-only models, no FFN sub-layer in any block (default: cem_mlp "
                  "for CEM, swiglu for the baseline)")
      ->check(CLI::IsMember({"none"}));
  app->add_option(
         "--scale-from", flags->scale_from,
         "T of the model also run at every other --steps value (test-time scaling; 0 = none)")
      ->check(CLI::Range(int64_t{0}, int64_t{64}));
  app->add_flag("--no-baseline", flags->no_baseline, "Skip the Llama baseline (mha + swiglu)");
  app->add_option("--seed", flags->seed,
                  "Seed of the inits, the training stream and the held-out set")
      ->check(seed_check());
  app->add_option(
      "--out", flags->out,
      "Directory for gp.json and gp-rmse.svg (default runs/gp, --quick: runs/gp-quick)");
  app->add_flag("--json", flags->json, "Print one JSON object instead of the table");
  app->add_option("--replot", flags->replot,
                  "Only redraw the plot of a finished run from its gp.json (into --out, default: "
                  "beside the file)");
  app->add_flag("--quick", flags->quick,
                "A small run (about a minute on 2 cores) for a first look");
  app->add_option("--val-seqs", flags->val_seqs,
                  "Validation sequences, drawn from their own stream apart from the held-out "
                  "(test) set: choose --lr on these (default: none; --one: 256)")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  CLI::Option* one =
      app->add_flag("--one", flags->one,
                    "Train and evaluate one model (--model, one --variants value, one --steps "
                    "value) and print its result as one JSON object (the GP job of cemfrac "
                    "compare)");
  CLI::Option* model =
      app->add_option("--model", flags->model, "--one: cem (default) or llama (mha + swiglu)")
          ->check(CLI::IsMember({"cem", "llama"}));
  CLI::Option* eval_steps =
      app->add_option("--eval-steps", flags->eval_steps,
                      "--one: also evaluate the trained CEM model at these T on the test set")
          ->delimiter(',')
          ->check(CLI::Range(1, 64));
  CLI::Option* eval_seed = app->add_option(
      "--eval-seed", flags->eval_seed,
      "--one: seed of the validation and test sets (--seed: init and training stream)");
  CLI::Option* checkpoint_dir = app->add_option(
      "--checkpoint-dir", flags->checkpoint_dir,
      "--one: keep the training's state in DIR/checkpoints (every 1/20 of the steps and at the "
      "end) and resume from there bit for bit when started again; Ctrl-C saves one and stops");
  model->needs(one);
  eval_steps->needs(one);
  eval_seed->needs(one);
  checkpoint_dir->needs(one);
  for (const char* other : {"--replot", "--quick", "--no-baseline", "--scale-from"})
    one->excludes(app->get_option(other));

  auto run = [flags, app, &global]() {
    const GpFlags& f = *flags;
    // One thread unless --threads says otherwise: the matrices are 128 wide, and splitting every op
    // over threads cost more than it saved (2-core machine under load: T = 1 ran 3.8 steps/s on one
    // thread, 0.6 on two; docs/gp.md).
    if (global.threads == 0) set_threads(1);
    if (!f.replot.empty()) return replot_gp(f);
    GpGiven given;
    given.steps = app->count("--steps") > 0;
    given.variants = app->count("--variants") > 0;
    given.eval_seqs = app->count("--eval-seqs") > 0;
    const GpExperimentOptions o = gp_options(f, global);
    return f.one ? run_gp_one(f, o, given) : run_gp_experiment_command(f, o, given);
  };
  return {app, run};
}

}  // namespace cemfrac::cli
