#include "cemfrac/tasks/gp_experiment.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <optional>

#include "cemfrac/core/check.h"
#include "cemfrac/core/clock.h"
#include "cemfrac/core/random.h"
#include "cemfrac/io/plot.h"
#include "cemfrac/io/safetensors.h"
#include "cemfrac/layers/param_tags.h"
#include "cemfrac/train/checkpoint.h"
#include "cemfrac/train/optimizer.h"
#include "cemfrac/train/schedule.h"
#include "cemfrac/train/trainer.h"

namespace cemfrac {

namespace {

using Clock = std::chrono::steady_clock;

// Per-sequence mean squared differences (S) -> RMSE and its standard error over sequences
// (delta method: se(sqrt(m)) = se(m) / (2 sqrt(m))).
std::pair<double, double> rmse_with_se(const torch::Tensor& per_seq_mse) {
  const double mse = per_seq_mse.mean().item<double>();
  const int64_t S = per_seq_mse.size(0);
  const double se_mse = S > 1 ? per_seq_mse.std().item<double>() / std::sqrt(double(S)) : 0.0;
  const double rmse = std::sqrt(mse);
  return {rmse, rmse > 0 ? se_mse / (2 * rmse) : 0.0};
}

TrainConfig gp_train_config(const GpTaskOptions& task, const GpTrainOptions& options) {
  TrainConfig c;
  c.steps = options.steps;
  c.micro_batch = options.batch;
  c.seq_len = task.n_points - 1;  // one prediction per token
  c.tokens_per_step = 0;          // one micro-batch per step
  c.lr_max = options.lr_max;
  c.lr_min = options.lr_min;
  c.warmup_steps = std::min(options.warmup_steps, options.steps);
  c.weight_decay = options.weight_decay;
  c.grad_clip = options.clip;
  c.seed = options.data_seed;
  c.log_every = std::max<int64_t>(1, options.steps / 10);
  c.eval_every = 0;  // no validation set: the task scores the model after training
  c.checkpoint_every = options.checkpoint_every > 0 ? options.checkpoint_every
                                                    : std::max<int64_t>(1, options.steps / 20);
  c.keep_checkpoints = 1;
  c.out = options.checkpoint_run_dir;
  c.dyadic = false;
  return c;
}

// What identifies a GP training's data: every task field and the stream's seed.
nlohmann::json gp_data_settings(GpTaskOptions task, uint64_t data_seed) {
  nlohmann::json settings = {{"data gp seed", data_seed}};
  auto add = [&settings](const char* key, const auto& value, const char*) {
    settings[std::string("data gp ") + key] = value;
  };
  task.visit_fields(add);
  return settings;
}

// The GP task as the trainer's data: a fresh batch of micro_batch sequences from the task's own
// generator at every step (the same stream for every model of one data seed); no validation set
// (the task scores its models after training, evaluate_gp_model). The cursor is the generator's
// state.
class GpData : public TrainingData {
 public:
  GpData(const GpTaskOptions& task, uint64_t data_seed)
      : task_(task), data_seed_(data_seed), generator_(at::detail::createCPUGenerator(data_seed)) {}

  void open(const DataLayout& layout) override {
    CEMFRAC_CHECK(layout.seq_len == task_.n_points - 1,
                  "GP training: {} positions per sequence, but the task's sequences have {}",
                  layout.seq_len, task_.n_points - 1);
    batch_ = layout.micro_batch;
  }
  TrainBatch next() override {
    GpBatch b = sample_gp_batch(batch_, task_, generator_, /*with_oracle=*/false);
    return {std::move(b.tokens), std::move(b.targets)};
  }
  void skip(int64_t rows) override {
    CEMFRAC_CHECK(rows == 0, "the GP task trains in one process (no data-parallel batches)");
  }
  nlohmann::json state() const override { return {{"gp_generator", generator_state(generator_)}}; }
  void restore(const nlohmann::json& state, const std::string& source) override {
    CEMFRAC_CHECK(state.contains("gp_generator") && state.at("gp_generator").is_string(),
                  "{}: not a checkpoint of a GP training of this cemfrac (no GP data cursor); "
                  "remove its checkpoints/ folder to start again",
                  source);
    set_generator_state(generator_, state.at("gp_generator").get<std::string>(), source);
  }
  std::string describe(const nlohmann::json&) const override {
    return fmt::format("GP data seed {}", data_seed_);
  }
  nlohmann::json settings() const override { return gp_data_settings(task_, data_seed_); }

 private:
  GpTaskOptions task_;
  uint64_t data_seed_ = 0;
  mutable at::Generator generator_;  // generator_state() reads it through a non-const reference
  int64_t batch_ = 1;
};

TrainModel gp_train_model(GpModel& model) {
  TrainModel tm;
  tm.module = model.ptr();
  tm.forward = [model](const torch::Tensor& tokens) mutable { return model->forward(tokens); };
  tm.params = model->parameter_table();
  tm.config = to_json(model->config());
  tm.context = model->config().context;
  tm.buffers = state_buffers(*model);
  const auto params = model->parameters();
  if (!params.empty()) tm.device = params.front().device();
  return tm;
}

}  // namespace

int64_t last_logged_step(const std::string& log) {
  // The progress line's shape is train_gp_model's "{}: step {}/{} | ..." below.
  static const std::string mark = ": step ";
  for (size_t at = log.rfind(mark); at != std::string::npos;
       at = at == 0 ? std::string::npos : log.rfind(mark, at - 1)) {
    size_t p = at + mark.size();
    int64_t k = 0;
    const size_t digits = p;
    while (p < log.size() && log[p] >= '0' && log[p] <= '9' && p - digits < 18)
      k = 10 * k + (log[p++] - '0');
    if (p > digits && p < log.size() && log[p] == '/') return k;
  }
  return 0;
}

GpTrainResult train_gp_model(GpModel& model, const GpTaskOptions& task,
                             const GpTrainOptions& options) {
  CEMFRAC_CHECK(options.steps >= 1, "GP training needs at least 1 step, got {}", options.steps);
  CEMFRAC_CHECK(options.batch >= 1, "GP batch size {} must be at least 1", options.batch);
  const bool checkpoints = !options.checkpoint_run_dir.empty();
  TrainerOptions t;
  t.train = gp_train_config(task, options);
  t.data = std::make_shared<GpData>(task, options.data_seed);
  t.loss = mse_loss();
  t.write_files = checkpoints;
  t.lock_command = "gp";
  t.require_new_dir = false;  // --checkpoint-dir is a job's working folder (trainer.h)
  t.handle_signals = checkpoints && options.stop_on_signal;
  t.progress = options.progress;
  t.label = options.label;
  t.stop_at_step = checkpoints ? options.stop_at_step : 0;
  // A checkpointed training resumes from its newest complete checkpoint, by itself.
  if (checkpoints && !list_checkpoints(options.checkpoint_run_dir).empty())
    t.resume = options.checkpoint_run_dir;

  GpTrainResult result;
  model->train();
  Trainer trainer(gp_train_model(model), t);
  if (trainer.step() > 0) {
    result.resumed_from = trainer.step();
    if (options.progress)
      std::cerr << fmt::format("{}: resumed from {} (step {}/{})\n", options.label,
                               resolve_checkpoint(options.checkpoint_run_dir), trainer.step(),
                               options.steps);
  }
  try {
    const TrainResult r = trainer.run();
    result.steps = r.step;
    result.checkpoint = r.last_checkpoint;
    result.interrupted = r.status != TrainStatus::kCompleted;
    result.last_loss = result.interrupted ? std::nan("") : r.recent_loss;
    result.seconds = r.elapsed_s;
    if (result.interrupted && options.progress)
      std::cerr << fmt::format("{}: interrupted at step {}/{}; checkpoint {}\n", options.label,
                               r.step, options.steps, r.last_checkpoint);
  } catch (const TrainingDiverged& e) {
    if (options.throw_on_nonfinite) throw;
    result.diverged = true;
    result.diverged_at_step = e.step();
    result.steps = e.step() - 1;
    result.last_loss = std::nan("");
    result.seconds = trainer.elapsed_s();
  }
  model->eval();
  return result;
}

GpEvalResult evaluate_gp_model(GpModel& model, const GpBatch& heldout, int64_t chunk) {
  TORCH_INTERNAL_ASSERT(heldout.posterior_mean.defined(), "held-out set without the oracle");
  TORCH_INTERNAL_ASSERT(chunk >= 1);
  const auto start = Clock::now();
  torch::NoGradGuard no_grad;
  model->eval();
  const torch::Device device = model->parameters().front().device();
  const int64_t S = heldout.tokens.size(0);
  std::vector<torch::Tensor> preds;
  for (int64_t begin = 0; begin < S; begin += chunk) {
    const int64_t n = std::min(chunk, S - begin);
    // The held-out set lives on the host (CPU generators); the model may be elsewhere.
    const torch::Tensor tokens = heldout.tokens.narrow(0, begin, n).to(device);
    preds.push_back(model->forward(tokens).to(torch::kCPU, torch::kFloat64));
  }
  torch::Tensor pred = torch::cat(preds, 0);                        // (S, N - 1) float64
  torch::Tensor y = heldout.y.narrow(1, 1, heldout.y.size(1) - 1);  // (S, N - 1) float64
  const torch::Tensor& mu = heldout.posterior_mean;                 // (S, N - 1) float64
  GpEvalResult r;
  std::tie(r.rmse_targets, r.se_targets) = rmse_with_se((pred - y).pow(2).mean(1));
  std::tie(r.rmse_posterior, r.se_posterior) = rmse_with_se((pred - mu).pow(2).mean(1));
  std::tie(r.rmse_oracle, r.se_oracle) = rmse_with_se((mu - y).pow(2).mean(1));
  r.seconds = seconds_since(start);
  return r;
}

GpSeeds gp_seeds(uint64_t seed) {
  SplitMix64 stream(seed);
  GpSeeds s;
  s.init = stream.next();
  s.train = stream.next();
  s.test = stream.next();
  s.val = stream.next();
  return s;
}

GpExperimentOptions default_gp_experiment() {
  GpExperimentOptions o;
  ModelConfig base;
  base.d_model = 128;
  base.n_heads = 4;
  base.d_ff = 512;
  base.n_layers = 2;
  base.context = o.task.n_points - 1;
  base.positions = Positions::kNone;  // the points are exchangeable; each token carries its own t
  base.norm = NormKind::kRmsNorm;
  base.bias = false;
  base.vocab_size = 1;  // unused: no token embedding
  o.cem_model = base;
  o.cem_model.mixer = "cem_attention";
  o.cem_model.ffn = "cem_mlp";
  o.baseline = base;
  o.baseline.mixer = "mha";
  o.baseline.ffn = "swiglu";
  return o;
}

void apply_gp_variant(ModelConfig& config, const std::string& variant) {
  CEMFRAC_CHECK(
      !variant.empty(),
      "empty GP variant name; valid: fixed, or '+'-joined iterate, prox, prox_fixed, step_norm, "
      "linear");
  if (variant == "fixed") return;
  size_t begin = 0;
  while (begin <= variant.size()) {
    const size_t end = std::min(variant.find('+', begin), variant.size());
    const std::string part = variant.substr(begin, end - begin);
    if (part == "iterate") {
      config.cem.recursion_keys = CemRecursionKeys::kIterate;
    } else if (part == "prox") {
      config.cem.prox = CemProxMode::kLearned;
    } else if (part == "prox_fixed") {
      config.cem.prox = CemProxMode::kFixed;
    } else if (part == "step_norm") {
      config.cem.step_norm = CemStepNorm::kRms;
    } else if (part == "linear") {
      config.cem.attention = CemAttentionKernel::kLinear;
    } else {
      fail(
          "GP variant \"{}\": unknown part \"{}\"; valid: fixed, or '+'-joined iterate, prox, "
          "prox_fixed, step_norm, linear",
          variant, part);
    }
    begin = end + 1;
  }
}

namespace {

// Every option problem, before any training: an unknown variant, a T out of range, sets too small.
void check_gp_experiment_options(const GpExperimentOptions& options) {
  CEMFRAC_CHECK(!options.steps.empty(), "no step counts T given (e.g. --steps 1,2,4,8)");
  CEMFRAC_CHECK(!options.variants.empty(), "no CEM variants given (e.g. --variants fixed,iterate)");
  for (const std::string& v : options.variants) {
    ModelConfig probe = options.cem_model;
    apply_gp_variant(probe, v);  // an unknown name fails before any training
  }
  for (int64_t T : options.steps) {
    CEMFRAC_CHECK(T >= 1 && T <= 64, "step count T = {}: must be in 1..64", T);
  }
  CEMFRAC_CHECK(options.eval_seqs >= 2, "held-out set of {} sequences: use at least 2",
                options.eval_seqs);
  CEMFRAC_CHECK(options.scale_from >= 0 && options.scale_from <= 64,
                "test-time scaling source T = {}: must be in 0..64 (0 = none)", options.scale_from);
  CEMFRAC_CHECK(options.val_seqs == 0 || options.val_seqs >= 2,
                "validation set of {} sequences: use 0 (none) or at least 2", options.val_seqs);
}

// The floor: the posterior mean itself as the prediction of the held-out set.
GpRow oracle_row(const GpBatch& heldout) {
  GpRow oracle;
  oracle.model = "oracle";
  torch::Tensor y = heldout.y.narrow(1, 1, heldout.y.size(1) - 1);  // (S, N - 1)
  std::tie(oracle.eval.rmse_targets, oracle.eval.se_targets) =
      rmse_with_se((heldout.posterior_mean - y).pow(2).mean(1));
  oracle.eval.rmse_oracle = oracle.eval.rmse_targets;
  oracle.eval.se_oracle = oracle.eval.se_targets;
  return oracle;
}

}  // namespace

namespace {

// One experiment's shared state: the seeds (one init for every model and T, one training stream,
// the held-out and validation sets), the sets themselves and the rows so far.
class GpExperiment {
 public:
  explicit GpExperiment(const GpExperimentOptions& o) : o_(o), seeds_(gp_seeds(o.seed)) {
    at::Generator heldout_gen = at::detail::createCPUGenerator(seeds_.test);
    heldout_ = sample_gp_batch(o.eval_seqs, o.task, heldout_gen, true);
    if (o.val_seqs > 0) {
      at::Generator val_gen = at::detail::createCPUGenerator(seeds_.val);
      val_set_ = sample_gp_batch(o.val_seqs, o.task, val_gen, true);
    }
    result_.train_steps = o.train.steps;
    result_.batch = o.train.batch;
    result_.eval_seqs = o.eval_seqs;
    result_.n_points = o.task.n_points;
    result_.seed = o.seed;
    result_.val_seqs = o.val_seqs;
  }

  // Every listed T of one CEM reading (and, with scale_from, that T's model evaluated at the
  // others, listed after them).
  void run_variant(const std::string& variant) {
    std::vector<int64_t> train_Ts = o_.steps;
    const bool scale = o_.scale_from > 0;
    if (scale && std::find(train_Ts.begin(), train_Ts.end(), o_.scale_from) == train_Ts.end())
      train_Ts.push_back(o_.scale_from);
    std::vector<GpRow> scaled;
    for (int64_t T : train_Ts) {
      ModelConfig config = o_.cem_model;
      apply_gp_variant(config, variant);
      config.cem.steps = T;
      if (T == 1 && T != o_.scale_from && copy_t1_row(config, variant)) continue;
      const std::string label =
          variant == "fixed" ? fmt::format("cem T={}", T) : fmt::format("cem {} T={}", variant, T);
      auto [model, tr] = train_one(config, label);
      const bool listed = std::find(o_.steps.begin(), o_.steps.end(), T) != o_.steps.end();
      if (listed)
        result_.rows.push_back(row_of(model, "cem", T, T, tr.seconds, tr.last_loss, variant));
      if (listed && T == 1) t1_rows_.emplace(config.cem.attention, result_.rows.back());
      if (scale && T == o_.scale_from) {
        for (int64_t eval_T : o_.steps) {
          if (eval_T == T) continue;
          GpModel other = gp_model_with_steps(model, eval_T);
          scaled.push_back(row_of(other, "cem", T, eval_T, 0.0, tr.last_loss, variant));
        }
      }
    }
    for (GpRow& row : scaled) result_.rows.push_back(row);
  }

  void run_baseline() {
    auto [model, tr] =
        train_one(o_.baseline, "baseline " + o_.baseline.mixer + "+" + o_.baseline.ffn);
    result_.rows.push_back(row_of(model, "llama", 0, 0, tr.seconds, tr.last_loss));
  }

  GpExperimentResult finish(double seconds) {
    result_.rows.push_back(oracle_row(heldout_));
    result_.seconds = seconds;
    return std::move(result_);
  }

 private:
  std::pair<GpModel, GpTrainResult> train_one(const ModelConfig& config, const std::string& label) {
    torch::manual_seed(seeds_.init);
    GpModel model(config, o_.device);
    GpTrainOptions train = o_.train;
    train.data_seed = seeds_.train;
    train.label = label;
    GpTrainResult tr = train_gp_model(model, o_.task, train);
    return {model, tr};
  }

  GpRow row_of(GpModel& model, const std::string& kind, int64_t train_T, int64_t eval_T,
               double train_s, double last_loss, const std::string& variant = "") {
    GpRow row;
    row.model = kind;
    row.variant = variant;
    row.train_T = train_T;
    row.eval_T = eval_T;
    row.eval = evaluate_gp_model(model, heldout_);
    if (val_set_) row.val = evaluate_gp_model(model, *val_set_);
    row.params = model->num_parameters();
    row.train_s = train_s;
    row.last_train_loss = last_loss;
    return row;
  }

  // At T = 1 every variant computes the default layer's function (docs/layers/cem.md §8) of its
  // attention energy, starts from the same weights (a learned lambda aside, which gets no gradient
  // at T = 1) and sees the same batches: its training would repeat the first such variant's bit
  // for bit, so that variant's row is copied. False when there is none yet.
  bool copy_t1_row(const ModelConfig& config, const std::string& variant) {
    const auto t1_row = t1_rows_.find(config.cem.attention);
    if (t1_row == t1_rows_.end()) return false;
    GpRow row = t1_row->second;
    row.variant = variant;
    torch::manual_seed(seeds_.init);
    row.params = GpModel(config)->num_parameters();
    result_.rows.push_back(row);
    return true;
  }

  const GpExperimentOptions& o_;
  const GpSeeds seeds_;
  GpBatch heldout_;
  std::optional<GpBatch> val_set_;
  GpExperimentResult result_;
  // The T = 1 row of the first variant with each attention energy (softmax, linear).
  std::map<CemAttentionKernel, GpRow> t1_rows_;
};

}  // namespace

GpExperimentResult run_gp_experiment(const GpExperimentOptions& options) {
  check_gp_experiment_options(options);
  const auto start = Clock::now();
  GpExperiment e(options);
  for (const std::string& variant : options.variants) e.run_variant(variant);
  if (options.run_baseline) e.run_baseline();
  return e.finish(seconds_since(start));
}

namespace {

// Which rows of a GP result carry a field.
enum class RowScope { kAll, kCem, kModel };  // every row; CEM rows; trained models (not the oracle)

// A GP result row's JSON fields, declared once for the writer and the reader: the key, the member,
// the rows that carry it, and whether 0 is written as null (a T of a row without one).
template <typename Row, typename Visitor>
void visit_gp_row(Row& row, Visitor&& v) {
  v("rmse_targets", row.eval.rmse_targets, RowScope::kAll, false);
  v("se_targets", row.eval.se_targets, RowScope::kAll, false);
  v("variant", row.variant, RowScope::kCem, false);
  v("train_T", row.train_T, RowScope::kModel, true);
  v("eval_T", row.eval_T, RowScope::kModel, true);
  v("rmse_posterior", row.eval.rmse_posterior, RowScope::kModel, false);
  v("se_posterior", row.eval.se_posterior, RowScope::kModel, false);
  v("params", row.params, RowScope::kModel, false);
  v("train_s", row.train_s, RowScope::kModel, false);
  v("eval_s", row.eval.seconds, RowScope::kModel, false);
  v("last_train_mse", row.last_train_loss, RowScope::kModel, false);
}

bool row_has(const std::string& model, RowScope scope) {
  return scope == RowScope::kAll || (scope == RowScope::kCem && model == "cem") ||
         (scope == RowScope::kModel && model != "oracle");
}

}  // namespace

// The result's own top-level keys, for writing and reading alike (val_seqs is written only when a
// validation set was drawn, and reads as 0 when absent).
template <typename Result, typename F>
void visit_gp_result(Result& r, F&& f) {
  f("train_steps", r.train_steps);
  f("batch", r.batch);
  f("eval_seqs", r.eval_seqs);
  f("n_points", r.n_points);
  f("seed", r.seed);
  f("seconds", r.seconds);
}

nlohmann::json to_json(const GpExperimentResult& result) {
  nlohmann::json rows = nlohmann::json::array();
  for (const GpRow& r : result.rows) {
    nlohmann::json j = {{"model", r.model}};
    visit_gp_row(r, [&](const char* key, auto& field, RowScope scope, bool zero_is_null) {
      if (!row_has(r.model, scope)) return;
      using F = std::decay_t<decltype(field)>;
      if constexpr (std::is_integral_v<F>) {
        if (zero_is_null && field == 0) {
          j[key] = nullptr;
          return;
        }
      }
      j[key] = field;
    });
    // Only rows scored on a validation set carry its two RMSEs.
    if (r.val && row_has(r.model, RowScope::kModel)) {
      j["val_rmse_targets"] = r.val->rmse_targets;
      j["val_rmse_posterior"] = r.val->rmse_posterior;
    }
    rows.push_back(j);
  }
  nlohmann::json out = {{"rows", rows}};
  visit_gp_result(result, [&](const char* key, const auto& field) { out[key] = field; });
  // Only with a validation set, so the files of runs without one stay as they were.
  if (result.val_seqs > 0) out["val_seqs"] = result.val_seqs;
  return out;
}

GpExperimentResult gp_result_from_json(const nlohmann::json& j, const std::string& source) {
  try {
    GpExperimentResult r;
    visit_gp_result(r, [&](const char* key, auto& field) {
      field = j.at(key).get<std::decay_t<decltype(field)>>();
    });
    r.val_seqs = j.value("val_seqs", int64_t{0});
    for (const nlohmann::json& row : j.at("rows")) {
      GpRow g;
      g.model = row.at("model").get<std::string>();
      visit_gp_row(g, [&](const char* key, auto& field, RowScope scope, bool zero_is_null) {
        if (!row_has(g.model, scope)) return;
        using F = std::decay_t<decltype(field)>;
        // Results written before the variants existed have CEM rows without "variant": the
        // default.
        if constexpr (std::is_same_v<F, std::string>) {
          if (!row.contains(key)) {
            field = "fixed";
            return;
          }
        }
        if (zero_is_null && row.at(key).is_null()) {
          field = F{};
          return;
        }
        field = row.at(key).get<F>();
      });
      if (row_has(g.model, RowScope::kModel) && row.contains("val_rmse_posterior")) {
        GpEvalResult v;
        v.rmse_targets = row.at("val_rmse_targets").get<double>();
        v.rmse_posterior = row.at("val_rmse_posterior").get<double>();
        g.val = v;
      }
      r.rows.push_back(g);
    }
    return r;
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not a cemfrac gp result ({})", source, e.what());
  }
}

namespace {

// The two panels of gp_rmse_svg (cemfrac/io/plot.h): against the posterior mean, and against the
// noisy targets with the oracle's floor, over the T values `ts`.
struct GpRmsePanels {
  explicit GpRmsePanels(const std::vector<int64_t>& ts) {
    post.title = "RMSE against the GP posterior mean";
    tgt.title = "RMSE against the noisy targets";
    for (Plot* p : {&post, &tgt}) {
      p->x_label = "T (steps per sub-layer, log scale)";
      p->y_label = "RMSE";
      p->log_x = true;
      for (int64_t t : ts) p->x_ticks.push_back(static_cast<double>(t));
    }
  }

  // A curve of (T, RMSE) points in T order, into both panels.
  void add(const std::string& name, const std::string& colour, bool dashed,
           std::vector<const GpRow*> rows) {
    std::stable_sort(rows.begin(), rows.end(),
                     [](const GpRow* a, const GpRow* b) { return a->eval_T < b->eval_T; });
    PlotSeries sp;
    sp.name = name;
    sp.colour = colour;
    sp.dashed = dashed;
    sp.band = false;
    PlotSeries st = sp;
    for (const GpRow* r : rows) {
      const double T = static_cast<double>(r->eval_T);
      sp.x.push_back(T);
      sp.y.push_back(r->eval.rmse_posterior);
      st.x.push_back(T);
      st.y.push_back(r->eval.rmse_targets);
    }
    post.series.push_back(sp);
    tgt.series.push_back(st);
  }

  // One CEM reading in one colour: its models trained at T (solid) and each model run at other T
  // (dashed). `single`: the only reading is "fixed", which keeps the original colours and names.
  void add_variant(const GpExperimentResult& result, const std::string& variant,
                   const std::string& color, bool single) {
    std::vector<const GpRow*> own;
    std::map<int64_t, std::vector<const GpRow*>> by_source;  // the models run at other T
    for (const GpRow& r : result.rows) {
      if (r.model != "cem" || r.variant != variant) continue;
      if (r.train_T == r.eval_T)
        own.push_back(&r);
      else
        by_source[r.train_T];
    }
    add(single ? "CEM trained at T" : fmt::format("CEM {} trained at T", variant), color, false,
        own);
    for (auto& [source, rows] : by_source) {
      // Its own point (trained and run at `source`) joins the curve when present.
      for (const GpRow& r : result.rows)
        if (r.model == "cem" && r.variant == variant && r.train_T == source) rows.push_back(&r);
      add(single ? fmt::format("trained at T={}, run at T", source)
                 : fmt::format("{} trained at T={}, run at T", variant, source),
          single ? "#d62728" : color, true, rows);
    }
  }

  Plot post, tgt;
};

}  // namespace

std::string gp_rmse_svg(const GpExperimentResult& result) {
  std::vector<int64_t> ts;
  std::vector<std::string> variants;  // in order of appearance
  const GpRow* baseline = nullptr;
  const GpRow* oracle = nullptr;
  for (const GpRow& r : result.rows) {
    if (r.model == "cem") {
      if (std::find(ts.begin(), ts.end(), r.eval_T) == ts.end()) ts.push_back(r.eval_T);
      if (std::find(variants.begin(), variants.end(), r.variant) == variants.end())
        variants.push_back(r.variant);
    }
    if (r.model == "llama") baseline = &r;
    if (r.model == "oracle") oracle = &r;
  }
  std::sort(ts.begin(), ts.end());
  if (ts.empty()) ts.push_back(1);
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#9467bd", "#8c564b",
                                  "#e377c2", "#17becf", "#bcbd22"};
  const bool single = variants.size() == 1 && variants[0] == "fixed";
  GpRmsePanels panels(ts);
  for (size_t vi = 0; vi < variants.size(); ++vi)
    panels.add_variant(result, variants[vi], kColors[vi % 7], single);
  if (baseline) {
    panels.post.references.push_back({"Llama baseline", baseline->eval.rmse_posterior, "#2ca02c"});
    panels.tgt.references.push_back({"Llama baseline", baseline->eval.rmse_targets, "#2ca02c"});
  }
  if (oracle)
    panels.tgt.references.push_back(
        {"oracle (GP posterior mean)", oracle->eval.rmse_targets, "#000000"});
  return to_svg({panels.post, panels.tgt},
                fmt::format("cemfrac gp: {} steps x {} sequences, {} held-out sequences of {} "
                            "points, seed {}",
                            result.train_steps, result.batch, result.eval_seqs, result.n_points,
                            result.seed));
}

namespace {

// Whether the model has CEM steps T at all (a CEM mixer or FFN).
bool gp_is_cem(const ModelConfig& config) {
  return config.mixer == "cem_attention" || config.ffn == "cem_mlp";
}

}  // namespace

GpRunResult run_gp_single(const GpRunOptions& options) {
  CEMFRAC_CHECK(options.val_seqs == 0 || options.val_seqs >= 2,
                "validation set of {} sequences: use 0 (none) or at least 2", options.val_seqs);
  CEMFRAC_CHECK(options.test_seqs == 0 || options.test_seqs >= 2,
                "test set of {} sequences: use 0 (none) or at least 2", options.test_seqs);
  CEMFRAC_CHECK(gp_is_cem(options.model) || options.eval_steps.empty(),
                "test-time step counts T need a CEM model ({} + {} has no steps)",
                options.model.mixer, options.model.ffn);
  for (int64_t T : options.eval_steps)
    CEMFRAC_CHECK(T >= 1 && T <= 64, "test-time step count T = {}: must be in 1..64", T);
  // The run's seed: init and training stream; the eval seed: the validation and test sets (the
  // same sets for every seed of a suite, so that seeds pair on identical data).
  const GpSeeds own = gp_seeds(options.seed);
  const GpSeeds sets = gp_seeds(options.eval_seed);
  torch::manual_seed(own.init);
  GpModel model(options.model, options.device);
  GpTrainOptions train = options.train;
  train.data_seed = own.train;
  // Resumable: the trainer refuses to resume a checkpoint of other settings (the task, the budget,
  // the learning rate, the seeds: train.* and the data's settings) or another model (config.json).
  train.checkpoint_run_dir = options.checkpoint_run_dir;
  train.stop_on_signal = !options.checkpoint_run_dir.empty();
  GpRunResult result;
  result.params = model->num_parameters();
  result.train = train_gp_model(model, options.task, train);
  if (result.train.interrupted)
    throw TrainingInterrupted(fmt::format(
        "{}: interrupted at step {}/{}; its checkpoint is {}: run the same command again to "
        "resume",
        train.label, result.train.steps, train.steps, result.train.checkpoint));
  if (result.train.diverged) {
    result.status = "diverged";
    return result;
  }
  if (options.val_seqs > 0) {
    at::Generator gen = at::detail::createCPUGenerator(sets.val);
    const GpBatch val = sample_gp_batch(options.val_seqs, options.task, gen, true);
    result.val = evaluate_gp_model(model, val);
  }
  if (options.test_seqs > 0) {
    at::Generator gen = at::detail::createCPUGenerator(sets.test);
    const GpBatch test = sample_gp_batch(options.test_seqs, options.task, gen, true);
    result.test = evaluate_gp_model(model, test);
    const int64_t trained_T = options.model.cem.steps;
    for (int64_t T : options.eval_steps) {
      if (T == trained_T) {
        result.test_at[T] = *result.test;
        continue;
      }
      GpModel other = gp_model_with_steps(model, T);
      result.test_at[T] = evaluate_gp_model(other, test);
    }
    torch::Tensor y = test.y.narrow(1, 1, test.y.size(1) - 1);  // (S, N - 1)
    result.oracle_test_rmse = rmse_with_se((test.posterior_mean - y).pow(2).mean(1)).first;
  }
  return result;
}

nlohmann::json to_json(const GpRunResult& result, const GpRunOptions& options) {
  auto eval_json = [](const GpEvalResult& e) {
    return nlohmann::json{{"rmse_posterior", e.rmse_posterior},
                          {"se_posterior", e.se_posterior},
                          {"rmse_targets", e.rmse_targets},
                          {"se_targets", e.se_targets},
                          {"eval_s", e.seconds}};
  };
  nlohmann::json j = {{"status", result.status},
                      {"mixer", options.model.mixer},
                      {"ffn", options.model.ffn},
                      {"train_T", gp_is_cem(options.model) ? nlohmann::json(options.model.cem.steps)
                                                           : nlohmann::json(nullptr)},
                      {"params", result.params},
                      {"train_steps", options.train.steps},
                      {"steps_done", result.train.steps},
                      {"batch", options.train.batch},
                      {"lr", options.train.lr_max},
                      {"seed", options.seed},
                      {"eval_seed", options.eval_seed},
                      {"val_seqs", options.val_seqs},
                      {"test_seqs", options.test_seqs},
                      {"train_s", result.train.seconds},
                      {"resumed_from_step", result.train.resumed_from}};
  if (result.train.diverged) {
    j["diverged_at_step"] = result.train.diverged_at_step;
    return j;
  }
  j["last_train_mse"] = result.train.last_loss;
  j["val"] = result.val ? eval_json(*result.val) : nlohmann::json(nullptr);
  j["test"] = result.test ? eval_json(*result.test) : nlohmann::json(nullptr);
  nlohmann::json at = nlohmann::json::object();
  for (const auto& [T, e] : result.test_at) at[std::to_string(T)] = eval_json(e);
  j["test_at_T"] = at;
  if (result.test) j["oracle_test_rmse_targets"] = result.oracle_test_rmse;
  return j;
}

}  // namespace cemfrac
