#include "cemfrac/tasks/finetune.h"

#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstring>

#include "cemfrac/core/atomic_file.h"
#include "cemfrac/core/check.h"
#include "cemfrac/core/random.h"
#include "cemfrac/layers/base/embedding.h"
#include "cemfrac/layers/base/rope.h"
#include "cemfrac/layers/mixer.h"
#include "cemfrac/train/model_loader.h"
#include "cemfrac/train/trainer.h"

namespace cemfrac {

torch::Tensor lm_features(LmModel& model, const torch::Tensor& tokens) {
  // The steps of LmModelImpl::forward (model/lm_model.cpp) up to the head, from the model's public
  // parts; the twin test (tests/tasks/finetune_test.cpp) holds the two together.
  const ModelConfig& c = model->config();
  CEMFRAC_CHECK(tokens.dim() == 2 && tokens.size(1) <= c.context,
                "classifier input must be (batch, length <= {}) token ids", c.context);
  const int64_t N = tokens.size(1);
  const auto children = model->named_children();
  // 1. Embed tokens (and add learned positions).
  torch::Tensor z = model->wte().forward(tokens);
  if (const auto* wpe = children.find("wpe"))
    z = z + std::dynamic_pointer_cast<EmbeddingImpl>(*wpe)->weight.narrow(0, 0, N);
  // 2. The blocks.
  MixerContext ctx;
  ctx.capacity = c.context;
  if (c.positions == Positions::kRope) {
    RotaryEmbedding rope(c.head_dim(), c.context, c.rope_theta, c.rope_scaling);
    std::tie(ctx.rope_cos, ctx.rope_sin) = rope.tables(0, N, z.options());
  }
  for (int64_t l = 0; l < c.n_layers; ++l) z = model->block(l).forward(z, ctx);
  // 3. The final norm.
  return std::dynamic_pointer_cast<NormImpl>(children["norm_f"])->forward(z);
}

ClassifierHeadImpl::ClassifierHeadImpl(int64_t d_model, int64_t outputs, double init_std,
                                       torch::Device device) {
  weight = add_parameter("weight", init_normal({outputs, d_model}, init_std, device),
                         ParamKind::kHead, ParamGroup::kDecay);
  bias = add_parameter("bias", init_constant({outputs}, 0.0, device), ParamKind::kHead,
                       ParamGroup::kNoDecay);
}

torch::Tensor ClassifierHeadImpl::forward(const torch::Tensor& pooled) {
  return torch::addmm(bias, pooled, weight.t());
}

std::vector<EncodedExample> encode_examples(const LabelledSet& set, const Tokenizer& tokenizer,
                                            int64_t max_len) {
  std::vector<EncodedExample> out;
  out.reserve(set.examples.size());
  for (size_t i = 0; i < set.examples.size(); ++i) {
    const LabelledExample& ex = set.examples[i];
    const bool pair = !ex.text_b.empty();
    std::vector<TokenId> a = tokenizer.encode(ex.text_a), b;
    if (pair) b = tokenizer.encode(ex.text_b);
    const int64_t budget = max_len - 1 - (pair ? 1 : 0);
    CEMFRAC_CHECK(budget >= (pair ? 2 : 1), "--max-len {} leaves no room for the text of {}",
                  max_len, set.name);
    // Longest first: drop the last token of the longer text until both fit.
    while (static_cast<int64_t>(a.size() + b.size()) > budget) (a.size() >= b.size() ? a : b).pop_back();
    CEMFRAC_CHECK(!a.empty() && (!pair || !b.empty()), "{} example {}: a text encodes to no tokens",
                  set.name, i + 1);
    EncodedExample e;
    e.tokens.push_back(tokenizer.eot_id());
    e.tokens.insert(e.tokens.end(), a.begin(), a.end());
    if (pair) {
      e.tokens.push_back(tokenizer.eot_id());
      e.tokens.insert(e.tokens.end(), b.begin(), b.end());
    }
    e.label = ex.label;
    e.score = ex.score;
    out.push_back(std::move(e));
  }
  return out;
}

FinetuneData::FinetuneData(std::string task, bool regression, std::vector<EncodedExample> train,
                           std::vector<EncodedExample> validation, const Tokenizer* tokenizer)
    : task_(std::move(task)),
      regression_(regression),
      train_(std::move(train)),
      validation_(std::move(validation)),
      tokenizer_(tokenizer) {
  CEMFRAC_CHECK(!train_.empty(), "fine-tuning {}: no training examples", task_);
  TORCH_INTERNAL_ASSERT(tokenizer_ != nullptr);
  // FNV-1a over every token and target: part of settings(), so a resume on other data is refused.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int k = 0; k < 8; ++k) h = (h ^ ((v >> (8 * k)) & 0xff)) * 1099511628211ull;
  };
  for (const EncodedExample& e : train_) {
    mix(e.tokens.size());
    for (int64_t t : e.tokens) mix(static_cast<uint64_t>(t));
    mix(static_cast<uint64_t>(e.label));
    uint64_t bits = 0;
    std::memcpy(&bits, &e.score, sizeof bits);
    mix(bits);
  }
  fingerprint_ = h;
}

void FinetuneData::open(const DataLayout& layout) {
  layout_ = layout;
  for (const auto* set : {&train_, &validation_}) {
    for (const EncodedExample& e : *set) {
      CEMFRAC_CHECK(static_cast<int64_t>(e.tokens.size()) <= layout.seq_len,
                    "fine-tuning {}: an example of {} tokens is longer than train.seq_len {}",
                    task_, e.tokens.size(), layout.seq_len);
    }
  }
  start_epoch();
}

void FinetuneData::start_epoch() {
  order_ = seeded_permutation(train_.size(), layout_.seed + static_cast<uint64_t>(epoch_));
}

TrainBatch FinetuneData::batch_of(const std::vector<EncodedExample>& examples,
                                  const std::vector<size_t>& rows) const {
  const int64_t b = static_cast<int64_t>(rows.size());
  torch::Tensor inputs = torch::full({b, layout_.seq_len}, tokenizer_->eot_id(), torch::kInt64);
  auto in = inputs.accessor<int64_t, 2>();
  torch::Tensor targets =
      regression_ ? torch::zeros({b}, torch::kFloat32) : torch::zeros({b}, torch::kInt64);
  for (int64_t i = 0; i < b; ++i) {
    const EncodedExample& e = examples[rows[i]];
    for (size_t j = 0; j < e.tokens.size(); ++j) in[i][static_cast<int64_t>(j)] = e.tokens[j];
    if (regression_) {
      targets[i] = e.score;
    } else {
      targets[i] = e.label;
    }
  }
  return {inputs, targets};
}

TrainBatch FinetuneData::next() {
  std::vector<size_t> rows;
  for (int64_t i = 0; i < layout_.micro_batch; ++i) {
    if (index_ == static_cast<int64_t>(train_.size())) {
      ++epoch_;
      index_ = 0;
      start_epoch();
    }
    rows.push_back(order_[static_cast<size_t>(index_++)]);
  }
  return batch_of(train_, rows);
}

void FinetuneData::skip(int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    if (index_ == static_cast<int64_t>(train_.size())) {
      ++epoch_;
      index_ = 0;
      start_epoch();
    }
    ++index_;
  }
}

nlohmann::json FinetuneData::state() const {
  return {{"epoch", epoch_}, {"index", index_}};
}

void FinetuneData::restore(const nlohmann::json& state, const std::string& source) {
  CEMFRAC_CHECK(state.is_object() && state.contains("epoch") && state.contains("index") &&
                    state["epoch"].is_number_integer() && state["index"].is_number_integer(),
                "{}: not a checkpoint of a fine-tuning run (no {{epoch, index}} data cursor)",
                source);
  const int64_t e = state["epoch"].get<int64_t>(), i = state["index"].get<int64_t>();
  CEMFRAC_CHECK(e >= 0 && i >= 0 && i <= static_cast<int64_t>(train_.size()),
                "{}: data cursor epoch {} example {} does not fit {} training examples", source, e,
                i, train_.size());
  epoch_ = e;
  index_ = i;
  start_epoch();
}

std::string FinetuneData::describe(const nlohmann::json& state) const {
  return fmt::format("epoch {} example {}", state.value("epoch", 0), state.value("index", 0));
}

nlohmann::json FinetuneData::settings() const {
  return {{"data finetune task", task_},
          {"data train examples", train_.size()},
          {"data fingerprint", fmt::format("{:016x}", fingerprint_)}};
}

int64_t FinetuneData::validation_batches() const {
  const int64_t n = static_cast<int64_t>(validation_.size());
  return (n + layout_.micro_batch - 1) / layout_.micro_batch;
}

TrainBatch FinetuneData::validation_batch(int64_t k) const {
  std::vector<size_t> rows;
  const size_t from = static_cast<size_t>(k * layout_.micro_batch);
  for (size_t r = from; r < std::min(validation_.size(), from + static_cast<size_t>(layout_.micro_batch)); ++r)
    rows.push_back(r);
  return batch_of(validation_, rows);
}

torch::Tensor pool_last_token(const torch::Tensor& features, const torch::Tensor& tokens,
                              TokenId pad) {
  const int64_t S = tokens.size(1);
  // The last non-padding position: the largest index whose token is not the pad.
  const torch::Tensor pos =
      (tokens.ne(pad).to(torch::kInt64) * torch::arange(S, tokens.options().dtype(torch::kInt64)))
          .argmax(1);  // (B)
  return features.gather(1, pos.view({-1, 1, 1}).expand({-1, 1, features.size(2)})).squeeze(1);
}

void predict(const std::function<torch::Tensor(const torch::Tensor&)>& forward,
             const FinetuneData& data, const std::vector<EncodedExample>& examples,
             int64_t batch, bool regression, std::vector<int64_t>* classes,
             std::vector<double>* scores) {
  torch::NoGradGuard no_grad;
  for (size_t from = 0; from < examples.size(); from += static_cast<size_t>(batch)) {
    std::vector<size_t> rows;
    for (size_t r = from; r < std::min(examples.size(), from + static_cast<size_t>(batch)); ++r)
      rows.push_back(r);
    const torch::Tensor out = forward(data.batch_of(examples, rows).inputs).to(torch::kCPU);
    if (regression) {
      const torch::Tensor s = out.select(1, 0).to(torch::kFloat64).contiguous();
      for (int64_t i = 0; i < s.size(0); ++i) scores->push_back(s[i].item<double>());
      classes->resize(scores->size(), 0);
    } else {
      const torch::Tensor a = out.argmax(1).contiguous();
      for (int64_t i = 0; i < a.size(0); ++i) classes->push_back(a[i].item<int64_t>());
    }
  }
}

namespace {

// Every flag checked before anything is read or loaded.
void check_finetune_options(const FinetuneOptions& o) {
  CEMFRAC_CHECK(!o.checkpoint.empty() || !o.resume.empty(),
                "finetune needs --checkpoint (a pre-trained model) or --resume (a fine-tuning run)");
  CEMFRAC_CHECK(std::isfinite(o.lr) && o.lr > 0, "--lr {}: must be > 0", o.lr);
  CEMFRAC_CHECK(std::isfinite(o.epochs) && o.epochs > 0, "--epochs {}: must be > 0", o.epochs);
  CEMFRAC_CHECK(o.batch >= 1, "--batch {}: must be >= 1", o.batch);
  CEMFRAC_CHECK(o.warmup >= 0 && o.warmup < 1, "--warmup {}: must be in [0, 1)", o.warmup);
  CEMFRAC_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0,
                "--weight-decay {}: must be a finite number >= 0", o.weight_decay);
  CEMFRAC_CHECK(o.max_len == 0 || o.max_len >= 3,
                "--max-len {}: must be 0 (the model's context) or 3 or more", o.max_len);
  CEMFRAC_CHECK(o.stop_at_step >= 0, "--stop-at-step {}: must be >= 0 (0 = run every step)",
                o.stop_at_step);
  CEMFRAC_CHECK(o.checkpoint.empty() || o.resume.empty(),
                "--checkpoint and --resume exclude each other: a resumed fine-tuning run continues "
                "from its own checkpoint (drop --checkpoint)");
  CEMFRAC_CHECK(o.resume.empty() || std::filesystem::is_directory(o.resume),
                "--resume {}: no such directory", o.resume);
}

// The Trainer's settings of a fine-tuning: `o.epochs` passes over `n_train` examples, a validation
// and a checkpoint per epoch, cross-entropy (MSE for regression) on the head's outputs.
TrainerOptions finetune_trainer_options(const FinetuneOptions& o, const ClassificationTask& task,
                                        int64_t n_train, int64_t max_len, torch::Device device,
                                        std::shared_ptr<FinetuneData> data) {
  const int64_t per_epoch = (n_train + o.batch - 1) / o.batch;
  TrainerOptions t;
  t.train.steps =
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(o.epochs * static_cast<double>(n_train) /
                                                          static_cast<double>(o.batch))));
  t.train.micro_batch = o.batch;
  t.train.seq_len = max_len;
  t.train.tokens_per_step = 0;
  t.train.lr_max = o.lr;
  t.train.lr_min = 0;
  t.train.warmup_steps = static_cast<int64_t>(std::llround(o.warmup * t.train.steps));
  t.train.weight_decay = o.weight_decay;
  t.train.seed = o.seed;
  t.train.log_every = std::max<int64_t>(1, t.train.steps / 50);
  t.train.eval_every = std::min(per_epoch, t.train.steps);
  t.train.eval_tokens = 0;
  t.train.checkpoint_every = std::min(per_epoch, t.train.steps);
  t.train.out = o.resume.empty() ? o.out : o.resume;
  t.train.dyadic = false;         // a pre-trained model's ladder depths are all trained already
  t.train.device = device.str();  // as trainer.json records it
  t.data = data;
  if (task.regression) {
    t.loss = [](const torch::Tensor& out, const torch::Tensor& y, int64_t reduction) {
      return torch::mse_loss(out.select(1, 0), y.to(out.scalar_type()), reduction);
    };
  } else {
    t.loss = [](const torch::Tensor& out, const torch::Tensor& y, int64_t reduction) {
      return torch::cross_entropy_loss(out, y, /*weight=*/{}, reduction, /*ignore_index=*/-100,
                                       /*label_smoothing=*/0.0);
    };
  }
  t.resume = o.resume;
  t.progress = o.progress;
  t.label = "finetune " + task.name;
  t.lock_command = "finetune";
  t.out_key = "--out";
  t.stop_at_step = o.stop_at_step;
  return t;
}

// finetune.json's account of the run (its "evals" are added once evaluated).
nlohmann::json finetune_report(const FinetuneOptions& o, const ClassificationTask& task,
                               const std::string& pretrained, const TrainResult& r, int64_t steps,
                               int64_t max_len, size_t n_train) {
  nlohmann::json rep;
  rep["task"] = task.name;
  rep["regression"] = task.regression;
  rep["labels"] = task.labels;
  rep["pretrained"] = o.resume.empty() ? nlohmann::json(pretrained) : nlohmann::json(nullptr);
  rep["checkpoint"] = r.last_checkpoint;
  rep["status"] = to_string(r.status);
  rep["step"] = r.step;
  rep["steps"] = steps;
  rep["settings"] = {{"lr", o.lr},
                     {"epochs", o.epochs},
                     {"batch", o.batch},
                     {"max_len", max_len},
                     {"seed", o.seed},
                     {"warmup", o.warmup},
                     {"weight_decay", o.weight_decay}};
  rep["pooling"] = "final hidden state at the last non-padding token";
  rep["train_examples"] = n_train;
  return rep;
}

}  // namespace

FinetuneResult run_finetune(const FinetuneOptions& o) {
  check_finetune_options(o);
  // The data first: a bad file is reported before a model is loaded.
  const ClassificationTask task = read_finetune_task(o.task, o.data_dir);
  // With --resume the backbone's architecture and tokenizer come from the run's own checkpoint
  // (its head is set aside by load_model and restored by the trainer).
  CEMFRAC_CHECK(!o.device.is_meta(),
                "finetune on the meta device: fine-tuning reads its losses and predictions, which "
                "the meta device does not compute; use cpu or cuda");
  LoadedModel loaded = load_model(o.resume.empty() ? o.checkpoint : o.resume, o.sets, o.device);
  CEMFRAC_CHECK(loaded.tokenizer != nullptr,
                "{} has no tokenizer/ directory: cannot encode text for it", loaded.checkpoint);
  LmModel model = loaded.model;
  const ModelConfig& c = model->config();
  const int64_t max_len = o.max_len > 0 ? o.max_len : c.context;
  CEMFRAC_CHECK(max_len >= 3 && max_len <= c.context, "--max-len {}: must be 3..context {}",
                max_len, c.context);
  const Tokenizer& tok = *loaded.tokenizer;
  std::vector<EncodedExample> train = encode_examples(task.train, tok, max_len);
  std::vector<std::vector<EncodedExample>> evals;
  for (const LabelledSet& s : task.evals) evals.push_back(encode_examples(s, tok, max_len));
  auto data = std::make_shared<FinetuneData>(task.name, task.regression, train, evals.front(),
                                             &tok);

  seed_everything(o.seed);  // the head's initialisation
  const torch::Device device = o.device;
  const int64_t outputs = task.regression ? 1 : static_cast<int64_t>(task.labels.size());
  auto head = std::make_shared<ClassifierHeadImpl>(c.d_model, outputs, c.init_std, device);
  model->register_module("cls", head);
  const TokenId eot = tok.eot_id();
  auto forward = [model, head, eot, device](const torch::Tensor& batch) mutable {
    const torch::Tensor x = batch.to(device);           // predict() passes host batches
    return head->forward(pool_last_token(lm_features(model, x), x, eot));
  };
  TrainModel tm;
  tm.module = model.ptr();
  tm.forward = forward;
  tm.params = model->parameter_table();  // the backbone's and cls.weight, cls.bias
  tm.config = to_json(c);
  tm.context = c.context;
  tm.buffers = state_buffers(*model);
  tm.device = device;

  const TrainerOptions t =
      finetune_trainer_options(o, task, static_cast<int64_t>(train.size()), max_len, device, data);
  Trainer trainer(std::move(tm), t);
  const TrainResult r = trainer.run();

  FinetuneResult out;
  out.status = to_string(r.status);
  out.step = r.step;
  out.steps = t.train.steps;
  out.checkpoint = r.last_checkpoint;
  out.report = finetune_report(o, task, loaded.checkpoint, r, t.train.steps, max_len, train.size());
  if (r.status == TrainStatus::kInterrupted) return out;
  model->eval();
  for (size_t k = 0; k < evals.size(); ++k) {
    std::vector<int64_t> classes;
    std::vector<double> scores;
    predict(forward, *data, evals[k], o.batch, task.regression, &classes, &scores);
    out.report["evals"][task.evals[k].name] = task_metrics(task, task.evals[k], classes, scores);
  }
  write_file_atomic(trainer.run_dir() + "/finetune.json", out.report.dump(2) + "\n");
  return out;
}

}  // namespace cemfrac
