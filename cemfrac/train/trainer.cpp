#include "cemfrac/train/trainer.h"

#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/clock.h"
#include "cemfrac/core/compat.h"
#include "cemfrac/core/stop_signals.h"
#include "cemfrac/core/warn.h"
#include "cemfrac/io/safetensors.h"
#include "cemfrac/layers/cofrgenet/dyadic.h"
#include "cemfrac/dist/data_parallel.h"
#include "cemfrac/train/run_dir.h"
#include "cemfrac/train/token_data.h"

namespace cemfrac {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Set by SIGINT/SIGTERM (and request_stop); read after every step. Lock-free atomics are
// async-signal-safe.
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void on_stop_signal(int) {
  g_stop_requested.store(true);
}

json optional_json(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}

std::string format_rate(double tokens_per_s) {
  if (tokens_per_s >= 1e6) return fmt::format("{:.2f}M", tokens_per_s / 1e6);
  if (tokens_per_s >= 1e3) return fmt::format("{:.1f}k", tokens_per_s / 1e3);
  return fmt::format("{:.0f}", tokens_per_s);
}

// The directory of the run a checkpoint belongs to (<run>/checkpoints/step-N -> <run>); "" for a
// checkpoint directory that is not inside a checkpoints/ folder.
std::string run_dir_of_checkpoint(const std::string& checkpoint) {
  const fs::path parent = fs::path(checkpoint).lexically_normal().parent_path();
  if (parent.filename() != "checkpoints") return "";
  return parent.parent_path().empty() ? std::string(".") : parent.parent_path().string();
}

// The run directory a --resume path continues (resolve_checkpoint's three forms): a checkpoint ->
// run_dir_of_checkpoint, <run>/checkpoints -> <run>, a run directory -> itself.
std::string run_dir_of_resume_path(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(fs::path(path) / kCheckpointTrainerFile, ec))
    return run_dir_of_checkpoint(path);
  const fs::path p = fs::path(path).lexically_normal();
  if (p.filename() == "checkpoints" && list_checkpoints(path).empty())
    return p.parent_path().empty() ? std::string(".") : p.parent_path().string();
  return path;
}

bool same_path(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  const fs::path pa = fs::weakly_canonical(a, ec1), pb = fs::weakly_canonical(b, ec2);
  if (ec1 || ec2) return fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
  return pa == pb;
}

// The train.* settings of a run as {"train.key": value} (visit_fields), and the keys marked
// OnCheckpoint::kMayChange (the ones a resume may change). train.out is where the run is, not what
// it is: not a setting.
struct SettingsCollector {
  json* settings;
  std::vector<std::string>* may_change;
  template <typename F>
  void operator()(const char* key, F& value, const char*, OnCheckpoint use = OnCheckpoint::kFixed) {
    if (std::string(key) == "out") return;
    const std::string name = std::string("train.") + key;
    if (settings == nullptr) {
    } else if constexpr (HasEnumNames<F>::value) {
      (*settings)[name] = enum_name(value);
    } else {
      (*settings)[name] = value;
    }
    if (may_change != nullptr && use == OnCheckpoint::kMayChange) may_change->push_back(name);
  }
};

bool resume_safe(const std::string& key) {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    SettingsCollector collector{nullptr, &k};
    TrainConfig probe;
    probe.visit_fields(collector);
    return k;
  }();
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

bool same_setting(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  return a == b;
}

// The model's output for one batch, on the model's device. train.precision = "bf16": the forward
// runs under autocast (matrix products in bfloat16, the parameters float32 master weights), and
// the output is float32 again before the loss, which (with its backward seed) is computed in
// float32 outside autocast, as torch.autocast's recipe has it. The fused ops see either float32
// inputs (their float32 kernels) or bfloat16 ones (their ATen twins, under autocast's casting
// rules; the ladder computes in float32): docs/formats.md, train.precision.
torch::Tensor model_output(const TrainModel& model, const TrainBatch& batch, bool bf16) {
  const torch::Tensor inputs = batch.inputs.to(model.device);
  if (!bf16) return model.forward(inputs);
  torch::Tensor out;
  {
    compat::AutocastGuard autocast(model.device.type(), torch::kBFloat16);
    out = model.forward(inputs);
  }
  return out.is_floating_point() ? out.to(torch::kFloat32) : out;
}

}  // namespace

const char* to_string(TrainStatus status) {
  switch (status) {
    case TrainStatus::kCompleted: return "completed";
    case TrainStatus::kInterrupted: return "interrupted";
    case TrainStatus::kStopped: return "stopped";
  }
  return "?";
}

json to_json(const StepMetrics& m) {
  // Key order is part of the format (stable keys, one object per line).
  json j = json::object();
  j["step"] = m.step;
  j["tokens"] = m.tokens;
  j["loss"] = m.loss;
  j["val_loss"] = optional_json(m.val_loss);
  j["lr"] = m.lr;
  j["grad_norm"] = m.grad_norm;
  j["tokens_per_s"] = m.tokens_per_s;
  j["elapsed_s"] = m.elapsed_s;
  return j;
}

void seed_everything(uint64_t seed) {
  torch::manual_seed(seed);
}

TrainModel make_train_model(LmModel model) {
  TrainModel tm;
  tm.module = model.ptr();
  tm.forward = [model](const torch::Tensor& tokens) mutable { return model->forward(tokens); };
  tm.params = model->parameter_table();
  tm.config = to_json(model->config());
  tm.context = model->config().context;
  tm.vocab_size = model->config().vocab_size;
  tm.buffers = state_buffers(*model);
  const auto params = model->parameters();
  if (!params.empty()) tm.device = params.front().device();
  return tm;
}

void Trainer::request_stop() {
  g_stop_requested.store(true);
}

bool Trainer::stop_requested() const {
  return distributed() ? stop_agreed_ : g_stop_requested.load();
}

Trainer::Trainer(TrainModel model, TrainerOptions options)
    : model_(std::move(model)), options_(std::move(options)) {
  const TrainConfig& t = options_.train;
  TORCH_INTERNAL_ASSERT(model_.module && model_.forward, "TrainModel needs a module and forward");
  set_data_parallel_layout(options_);
  // The [train] checks of a run config (one set of checks and messages, run_config.cpp), for
  // options built in code as well.
  {
    TrainConfig checked = t;
    if (!options_.write_files) checked.out = "(in memory)";  // no run directory to name
    if (auto p = train_config_problem(checked, model_.context)) fail("{}", p->message);
  }
  CEMFRAC_CHECK(options_.write_files || options_.resume.empty(),
                "a training in memory (no run directory) cannot resume {}", options_.resume);
  size_steps();
  bf16_ = t.precision == "bf16";
  schedule_ = CosineSchedule{t.lr_max, t.lr_min, t.warmup_steps, t.steps};
  open_data();
  make_optimizer();

  state_.data_seed = t.seed;
  state_.schedule = schedule_;
  if (options_.resume.empty()) {
    if (!options_.write_files) return;
    // A new run goes only into a new or empty folder (train/run_dir.h), whichever command asks.
    if (options_.rank == 0 && options_.require_new_dir)
      check_new_run_dir(t.out, options_.out_key, options_.data_dir);
    lock_run_dir();
    return;
  }
  resume_from_checkpoint();
}

void Trainer::size_steps() {
  const TrainConfig& t = options_.train;
  seq_len_ = t.seq_len > 0 ? t.seq_len : model_.context;
  CEMFRAC_CHECK(seq_len_ >= 1,
                "train.seq_len = {} and the model has no context length; set "
                "train.seq_len",
                t.seq_len);
  const int64_t micro_tokens = t.micro_batch * seq_len_;
  if (t.tokens_per_step > 0 && options_.world_size > 1) {
    const int64_t per_round = micro_tokens * options_.world_size;
    CEMFRAC_CHECK(
        t.tokens_per_step % per_round == 0,
        "train.tokens_per_step = {} is not a multiple of world size x micro_batch x seq_len "
        "= {} x {} x {} = {}",
        t.tokens_per_step, options_.world_size, t.micro_batch, seq_len_, per_round);
    accum_ = t.tokens_per_step / per_round;
  } else if (t.tokens_per_step > 0) {
    accum_ = t.tokens_per_step / micro_tokens;  // a multiple (train_config_problem)
  }
  tokens_per_step_ = accum_ * micro_tokens * options_.world_size;
}

void Trainer::open_data() {
  const TrainConfig& t = options_.train;
  data_ = options_.data;
  if (!data_) {
    TokenDataOptions token;
    token.dir = options_.data_dir;
    token.tokenizer = options_.tokenizer;
    token.verify = options_.verify_data;
    token.model_vocab_size = model_.vocab_size;
    data_ = std::make_shared<TokenData>(token);
  }
  loss_ = options_.loss ? options_.loss : cross_entropy_loss();
  DataLayout layout;
  layout.micro_batch = t.micro_batch;
  layout.seq_len = seq_len_;
  layout.seed = t.seed;
  layout.eval_tokens = t.eval_tokens;
  data_->open(layout);
}

void Trainer::make_optimizer() {
  const TrainConfig& t = options_.train;
  AdamWConfig ac;
  ac.lr = schedule_.lr(0);
  ac.beta1 = t.beta1;
  ac.beta2 = t.beta2;
  ac.eps = t.adam_eps;
  ac.weight_decay = t.weight_decay;
  // Dyadic schedule: ladder depth i waits in the frozen group until its step (begin_step).
  std::vector<ParamInfo> groups = model_.params;
  if (t.dyadic) {
    for (ParamInfo& p : groups) {
      if (p.depth <= 0 || p.group == ParamGroup::kFrozen) continue;
      dyadic_.push_back({p.name, p.group, dyadic_start(p.depth, t.steps)});
      p.group = ParamGroup::kFrozen;
    }
  }
  optimizer_ = std::make_unique<Optimizer>(*model_.module, groups, ac);
}

void Trainer::resume_from_checkpoint() {
  const TrainConfig& t = options_.train;
  // A resumed run continues in its own directory, whatever train.out says. Its directory is known
  // from the path alone, so it is locked before any checkpoint is looked at: a live writer may be
  // rotating them (and is then named, rather than a checkpoint it just removed).
  const std::string own_dir = run_dir_of_resume_path(options_.resume);
  if (!own_dir.empty() && !same_path(own_dir, options_.train.out)) {
    warn("train.out = {} is ignored: --resume continues the run in {}", options_.train.out,
         own_dir);
    options_.train.out = own_dir;
  }
  lock_run_dir();
  const std::string dir = resolve_checkpoint(options_.resume);
  LoadOptions load;
  load.expected_config = &model_.config;
  Checkpoint ckpt = load_checkpoint(dir, load);
  data_->check_checkpoint(dir);
  std::vector<NamedTarget> targets;
  for (const auto& [name, tensor] : parameters_by_name(*model_.module, model_.params))
    targets.push_back({name, tensor});
  load_into(ckpt.model.tensors, targets, (fs::path(dir) / kCheckpointModelFile).string());
  optimizer_->load_state(ckpt.optimizer, (fs::path(dir) / kCheckpointOptimizerFile).string());
  if (!model_.buffers.empty() || ckpt.has_buffers) {
    std::vector<NamedTarget> buffer_targets;
    for (const auto& [name, tensor] : model_.buffers) buffer_targets.push_back({name, tensor});
    const std::string buffers_file = (fs::path(dir) / kCheckpointBuffersFile).string();
    CEMFRAC_CHECK(ckpt.has_buffers, "{} is missing but the model has state buffers (e.g. '{}')",
                  buffers_file, model_.buffers.front().first);
    load_into(ckpt.buffers.tensors, buffer_targets, buffers_file);
  }
  state_ = ckpt.trainer;
  CEMFRAC_CHECK(state_.world_size == options_.world_size,
                "{}: written by a run of {} rank(s), resumed with {}; resume with the same number "
                "of ranks (cemfrac launch --nproc {})",
                dir, state_.world_size, options_.world_size, state_.world_size);
  const std::string trainer_json = (fs::path(dir) / kCheckpointTrainerFile).string();
  check_resume_settings(trainer_json);
  set_torch_rng_state(state_.torch_rng, trainer_json);
  set_cuda_rng_states(state_.cuda_rng, trainer_json);
  // check_resume_settings refused another train.seed, so the data order is the saved one.
  TORCH_INTERNAL_ASSERT(state_.data_seed == t.seed);
  data_->restore(state_.loader, trainer_json);
  state_.schedule = schedule_;  // the current config's schedule (it may extend the run)
  last_checkpoint_ = dir;
}

Trainer::~Trainer() = default;

void Trainer::lock_run_dir() {
  // One writer per run directory (core/dir_lock.h): rank 0 writes, so rank 0 locks. Taken after
  // the checks of the settings and the data, so that a refused run leaves no directory behind.
  if (options_.rank != 0 || !options_.write_files) return;
  int64_t died_at = 0;
  previous_status_ = run_status(options_.train.out, &died_at);
  lock_ = DirLock::acquire(options_.train.out, options_.lock_command);
  if (previous_status_ == RunStatus::kDied)
    warn(
        "{}: the process that last wrote this run died at step {} (summary.json said \"running\" "
        "and no process held the directory); {}",
        options_.train.out, died_at,
        options_.resume.empty() ? "starting it again from step 0"
                                : "resuming from its newest complete checkpoint");
}

json Trainer::run_settings() const {
  json settings = json::object();
  SettingsCollector collector{&settings, nullptr};
  TrainConfig t = options_.train;
  t.visit_fields(collector);
  // Resolved values (seq_len 0 -> the context; tokens_per_step 0 -> one micro-batch), so writing a
  // default out explicitly is no change.
  settings["train.seq_len"] = seq_len_;
  settings["train.tokens_per_step"] = accum_ * t.micro_batch * seq_len_;
  settings["world_size"] = options_.world_size;
  settings.update(data_->settings());
  return settings;
}

void Trainer::check_resume_settings(const std::string& source) {
  const json now = run_settings();
  // Checkpoints of older versions carry no settings; their data seed is still known.
  json saved = state_.run;
  if (!saved.contains("train.seed")) saved["train.seed"] = state_.data_seed;
  auto changed = [&](const std::string& key) {
    return saved.contains(key) && !same_setting(saved.at(key), now.at(key));
  };
  // Refusals first (so a refused command prints its one error line and nothing else), then
  // warnings.
  for (auto it = now.begin(); it != now.end(); ++it) {
    CEMFRAC_CHECK(resume_safe(it.key()) || !changed(it.key()),
                  "--resume: {} = {} but the run was trained with {} ({}); changing it breaks "
                  "exact resume: set it back, or start a new run",
                  it.key(), it.value().dump(), saved.at(it.key()).dump(), source);
  }
  for (auto it = now.begin(); it != now.end(); ++it) {
    if (!changed(it.key())) continue;
    const std::string was = saved.at(it.key()).dump(), is = it.value().dump();
    if (it.key() == "train.steps")
      warn(
          "train.steps changed from {} to {} on resume: the learning-rate schedule now spans {} "
          "steps from step {} on",
          was, is, is, state_.step);
    else
      warn("{} changed from {} to {} on resume (safe: training itself is unchanged)", it.key(), was,
           is);
  }
  state_.run = now;
}

std::optional<double> Trainer::evaluate() {
  const int64_t batches = data_->validation_batches();
  if (batches == 0) return std::nullopt;
  torch::NoGradGuard no_grad;
  model_.module->eval();
  // Per batch: the float64 sum of its losses and its number of targets.
  std::vector<double> sums(static_cast<size_t>(2 * batches), 0.0);
  for (int64_t k = options_.rank; k < batches; k += options_.world_size) {
    const TrainBatch batch = data_->validation_batch(k);
    const torch::Tensor output = model_output(model_, batch, bf16_);
    const torch::Tensor losses =
        loss_(output, batch.targets.to(model_.device), at::Reduction::None);
    sums[static_cast<size_t>(2 * k)] = losses.to(torch::kFloat64).sum().item<double>();
    sums[static_cast<size_t>(2 * k + 1)] = static_cast<double>(losses.numel());
  }
  // Each entry is non-zero on one rank only, so the sum over ranks is exact (x + 0 = x).
  if (distributed()) sums = options_.dist->allreduce_sum(sums, "validation loss", false);
  double total = 0, count = 0;
  for (int64_t k = 0; k < batches; ++k) {
    total += sums[static_cast<size_t>(2 * k)];
    count += sums[static_cast<size_t>(2 * k + 1)];
  }
  model_.module->train();
  return total / count;
}

void Trainer::begin_step(int64_t step) {
  for (const Pending& p : dyadic_) {
    if (step >= p.start && optimizer_->is_frozen(p.name)) optimizer_->unfreeze(p.name, p.group);
  }
  TrainProgress progress;
  progress.step = step;
  progress.total_steps = options_.train.steps;
  progress.dyadic = options_.train.dyadic;
  notify_train_step(*model_.module, progress);
}

double Trainer::train_step(double* grad_norm) {
  model_.module->train();
  optimizer_->zero_grad();
  step_position_ = data_->state();
  const int64_t block = accum_ * options_.train.micro_batch;  // rows per rank and step
  if (options_.rank > 0) data_->skip(options_.rank * block);
  double loss_sum = 0;
  for (int64_t a = 0; a < accum_; ++a) {
    const TrainBatch batch = data_->next();
    const torch::Tensor output = model_output(model_, batch, bf16_);
    // Every micro-batch has as many targets, so the step's loss is the mean of the micro-batch
    // means; dividing before backward makes the accumulated gradient that mean's gradient.
    const torch::Tensor loss = loss_(output, batch.targets.to(model_.device), at::Reduction::Mean);
    // Overlapped all-reduce: only the last micro-batch's backward launches communication.
    if (distributed() && a == accum_ - 1) options_.dist->before_last_backward(state_.step + 1);
    (loss / static_cast<double>(accum_)).backward();
    loss_sum += loss.item<double>();
  }
  const int64_t after = (options_.world_size - 1 - options_.rank) * block;
  if (after > 0) data_->skip(after);
  if (distributed()) loss_sum = reduce_step(loss_sum, g_stop_requested.load());
  *grad_norm = clip_gradients();
  return loss_sum / static_cast<double>(accum_ * options_.world_size);
}

std::string Trainer::write_checkpoint() {
  if (!options_.write_files) return last_checkpoint_;
  TensorMap optimizer_state = optimizer_state_to_save();  // with sharding, every rank takes part
  if (options_.rank != 0) return last_checkpoint_;
  CheckpointContents c;
  for (const auto& [name, tensor] : parameters_by_name(*model_.module, model_.params))
    c.model[name] = tensor;
  for (const auto& [name, tensor] : model_.buffers) c.buffers[name] = tensor;
  c.optimizer = std::move(optimizer_state);
  c.optimizer_metadata = optimizer_->state_metadata();
  state_.torch_rng = torch_rng_state();
  state_.cuda_rng = cuda_rng_states();
  state_.loader = data_->state();
  if (state_.run.empty()) state_.run = run_settings();
  state_.world_size = options_.world_size;
  c.trainer = state_;
  c.config = model_.config;
  c.tokenizer = data_->tokenizer();
  last_checkpoint_ = save_checkpoint(options_.train.out, c, options_.train.keep_checkpoints);
  // summary.json is true at all times: while running it names the step and checkpoint reached.
  write_summary("running", "");
  return last_checkpoint_;
}

void Trainer::append_metrics(const StepMetrics& m) {
  if (options_.rank != 0 || !options_.write_files) return;
  const std::string path = (fs::path(options_.train.out) / "metrics.jsonl").string();
  std::ofstream out(path, std::ios::app);
  CEMFRAC_CHECK(out.good(), "cannot append to {}", path);
  out << to_json(m).dump() << "\n";
  out.flush();
  CEMFRAC_CHECK(out.good(), "cannot write {} (disk full?)", path);
}

void Trainer::write_summary(const std::string& status, const std::string& report) {
  if (options_.rank != 0 || !options_.write_files) return;
  json j = json::object();
  j["status"] = status;
  j["step"] = state_.step;
  j["steps"] = options_.train.steps;
  j["tokens"] = state_.tokens;
  j["last_loss"] = optional_json(state_.last_loss);
  j["last_val_loss"] = optional_json(state_.last_val_loss);
  j["best_val_loss"] = optional_json(state_.best_val_loss);
  j["elapsed_s"] = state_.elapsed_s;
  j["tokens_per_s"] = state_.elapsed_s > 0 ? state_.tokens / state_.elapsed_s : 0.0;
  j["seq_len"] = seq_len_;
  j["micro_batch"] = options_.train.micro_batch;
  j["accumulation_steps"] = accum_;
  j["tokens_per_step"] = tokens_per_step_;
  j["last_checkpoint"] = last_checkpoint_.empty() ? json(nullptr) : json(last_checkpoint_);
  if (!report.empty()) j["report"] = report;
  if (status == "running") j["pid"] = static_cast<int64_t>(::getpid());
  if (previous_status_ != RunStatus::kNone) j["previous_status"] = enum_name(previous_status_);
  write_file_atomic((fs::path(options_.train.out) / "summary.json").string(), j.dump(2) + "\n");
}

TrainResult Trainer::run() {
  const TrainConfig& t = options_.train;
  const bool fresh = state_.step == 0 && last_checkpoint_.empty();
  if (fresh) torch::manual_seed(t.seed);
  g_stop_requested.store(false);
  ScopedStopSignals signals(options_.handle_signals && options_.write_files, on_stop_signal);
  if (distributed()) start_data_parallel();

  if (options_.rank == 0 && options_.write_files) {
    std::error_code ec;
    fs::create_directories(t.out, ec);
    CEMFRAC_CHECK(fs::is_directory(t.out), "cannot create the run directory {}{}", t.out,
                  ec ? ": " + ec.message() : "");
    // "running" until the run ends: a killed run leaves it (with the pid), never an older verdict.
    write_summary("running", "");
  }
  try {
    // metrics.jsonl: a fresh run starts it; a resumed one keeps the lines up to its checkpoint's
    // step (a killed run may have logged steps after it, which are about to be redone).
    if (options_.rank == 0 && options_.write_files) {
      const std::string path = (fs::path(t.out) / "metrics.jsonl").string();
      std::string kept;
      if (!fresh && fs::exists(path)) {
        std::istringstream in(read_file(path));
        for (std::string line; std::getline(in, line);) {
          json j = json::parse(line, nullptr, false);
          // A line without an integer step (a damaged file) is dropped, like an unparsable one.
          if (!j.is_discarded() && j.is_object() && j.contains("step") &&
              j["step"].is_number_integer() && j["step"].get<int64_t>() <= state_.step)
            kept += line + "\n";
        }
      }
      write_file_atomic(path, kept);
      for (const std::string& stale : clean_stale_temporaries(t.out))
        warn("removed {}, a temporary left by a checkpoint save that was killed", stale);
    }
    return run_loop();
  } catch (const TrainingDiverged&) {
    throw;  // summary.json already says "diverged"
  } catch (const std::exception& e) {
    try {
      write_summary("failed", e.what());
    } catch (const std::exception&) {
      // the original error is the one to report
    }
    throw;
  }
}

void Trainer::stop_diverged(double loss, double grad_norm, double lr, double elapsed_s) {
  const TrainConfig& t = options_.train;
  const std::string report = fmt::format(
      "{}training stopped at step {}/{}: non-finite {} (loss {}, grad norm {}) at lr {:.6g}, "
      "batch position {} ({} micro-batch(es) of {}); the step was not applied and nothing "
      "was saved; last good checkpoint: {}",
      options_.label.empty() ? "" : options_.label + ": ", state_.step + 1, t.steps,
      std::isfinite(loss) ? "gradient norm" : "loss", loss, grad_norm, lr,
      data_->describe(step_position_), accum_, t.micro_batch,
      last_checkpoint_.empty() ? "none" : last_checkpoint_);
  state_.elapsed_s = elapsed_s;
  write_summary("diverged", report);
  throw TrainingDiverged(report, state_.step + 1);
}

void Trainer::record_step(double loss, double lr) {
  state_.step += 1;
  state_.tokens += tokens_per_step_;
  state_.lr = lr;
  state_.last_loss = loss;
  state_.recent_losses.push_back(loss);
  if (static_cast<int64_t>(state_.recent_losses.size()) > kRecentLosses)
    state_.recent_losses.erase(state_.recent_losses.begin());
}

void Trainer::validate(StepMetrics& m) {
  m.val_loss = evaluate();
  if (!m.val_loss) return;
  state_.last_val_loss = m.val_loss;
  if (!state_.best_val_loss || *m.val_loss < *state_.best_val_loss)
    state_.best_val_loss = m.val_loss;
}

void Trainer::print_step(const StepMetrics& m, double per_step_s, bool tty) const {
  const TrainConfig& t = options_.train;
  std::string line =
      fmt::format("{}step {}/{} | loss {:.4f}", options_.label.empty() ? "" : options_.label + ": ",
                  m.step, t.steps, m.loss);
  if (m.val_loss) line += fmt::format(" | val {:.4f}", *m.val_loss);
  line += fmt::format(" | lr {:.2e} | norm {:.3f} | {} tok/s | ETA {}", m.lr, m.grad_norm,
                      format_rate(m.tokens_per_s),
                      format_duration(per_step_s * static_cast<double>(t.steps - m.step)));
  if (tty)
    std::cerr << "\r" << line << "\033[K" << std::flush;
  else
    std::cerr << line << "\n";
}

TrainResult Trainer::result(TrainStatus status) const {
  TrainResult r;
  r.status = status;
  r.step = state_.step;
  r.tokens = state_.tokens;
  r.last_loss = state_.last_loss.value_or(0.0);
  r.last_val_loss = state_.last_val_loss;
  r.best_val_loss = state_.best_val_loss;
  for (double l : state_.recent_losses) r.recent_loss += l;
  if (!state_.recent_losses.empty())
    r.recent_loss /= static_cast<double>(state_.recent_losses.size());
  r.last_checkpoint = last_checkpoint_;
  r.elapsed_s = state_.elapsed_s;
  return r;
}

TrainResult Trainer::run_loop() {
  using Clock = std::chrono::steady_clock;
  const TrainConfig& t = options_.train;

  const int64_t last_step =
      options_.stop_at_step > 0 ? std::min(options_.stop_at_step, t.steps) : t.steps;
  const bool tty = options_.progress && isatty(STDERR_FILENO);
  const auto session_start = Clock::now();
  const double elapsed_before = state_.elapsed_s;
  const int64_t first_step = state_.step;
  TrainStatus status = TrainStatus::kCompleted;

  while (state_.step < last_step) {
    const auto step_start = Clock::now();
    const double lr = schedule_.lr(state_.step);
    optimizer_->set_lr(lr);
    begin_step(state_.step);
    double grad_norm = 0;
    const double loss = train_step(&grad_norm);
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      if (tty) std::cerr << "\n";
      stop_diverged(loss, grad_norm, lr, elapsed_before + seconds_since(session_start));
    }
    optimizer_->step();
    if (!shards_.empty()) broadcast_updated_parameters();
    const double step_s = seconds_since(step_start);
    record_step(loss, lr);

    StepMetrics m;
    m.step = state_.step;
    m.tokens = state_.tokens;
    m.loss = loss;
    m.lr = lr;
    m.grad_norm = grad_norm;
    m.tokens_per_s = step_s > 0 ? tokens_per_step_ / step_s : 0.0;
    const bool stopping = stop_requested() || state_.step == last_step;
    if ((t.eval_every > 0 && state_.step % t.eval_every == 0) || state_.step == t.steps)
      validate(m);
    state_.elapsed_s = elapsed_before + seconds_since(session_start);
    m.elapsed_s = state_.elapsed_s;
    if (state_.step % t.log_every == 0 || m.val_loss || stopping) append_metrics(m);
    if (options_.progress && options_.rank == 0 &&
        (tty || state_.step % t.log_every == 0 || stopping))
      print_step(m, seconds_since(session_start) / static_cast<double>(state_.step - first_step),
                 tty);

    bool saved = false;
    if ((t.checkpoint_every > 0 && state_.step % t.checkpoint_every == 0) || stopping) {
      write_checkpoint();
      saved = true;
    }
    if (options_.on_step) options_.on_step(*this, m);
    if (stop_requested()) {
      status = TrainStatus::kInterrupted;
      if (!saved) write_checkpoint();
      break;
    }
  }
  if (tty) std::cerr << "\n";
  if (status == TrainStatus::kCompleted && state_.step < t.steps) status = TrainStatus::kStopped;
  write_summary(to_string(status), "");
  return result(status);
}

}  // namespace cemfrac
