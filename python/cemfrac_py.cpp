// cemfrac._C: the Python binding (docs/python.md). Thin: every computation is the
// library's own code, in the same process and the same LibTorch as torch (Debian's python3-torch
// loads the system libtorch). The Python package (python/cemfrac/*.py) builds torch.nn.Modules
// around these handles: their nn.Parameters are the C++ modules' parameter tensors themselves (same
// TensorImpl), so autograd, optimizers and state_dict() act on what the C++ forward reads.
//
// Errors: cemfrac::Error becomes cemfrac.Error (a ValueError) with the same one-line message;
// c10::Error (TORCH_CHECK) a RuntimeError with its message without the C++ backtrace. Calls that
// compute release the GIL, so Python threads run them concurrently.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>
#include <torch/types.h>

#include <nlohmann/json.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/core/device.h"
#include "cemfrac/core/fields.h"
#include "cemfrac/data/tokenizer.h"
#include "cemfrac/layers/base/rope.h"
#include "cemfrac/layers/param_tags.h"
#include "cemfrac/layers/registry.h"
#include "cemfrac/eval/tasks.h"
#include "cemfrac/model/generate.h"
#include "cemfrac/model/layer_factory.h"
#include "cemfrac/model/lm_model.h"
#include "cemfrac/model/model_config.h"
#include "cemfrac/ops/continuant.h"
#include "cemfrac/train/model_loader.h"

namespace py = pybind11;
using json = nlohmann::json;

namespace cemfrac {
namespace {

// ---- The continued-fraction op ------------------------------------------------------------------

// f = 1 / (a_1 + 1 / (a_2 + ... + 1 / a_d)) over dimension `dim` of `a` (the ladder depth), every
// other dimension a batch of ladders. dim = -2 of an (..., d, L) tensor is the kernel's own layout
// (no copy); any other dim moves the depth first and flattens the rest into one row of ladders.
at::Tensor continued_fraction(const at::Tensor& a, double eps, int64_t dim,
                              const std::string& backward, const std::string& impl) {
  CEMFRAC_CHECK(a.defined(), "continued_fraction: a is undefined");
  const int64_t n = a.dim();
  CEMFRAC_CHECK(n >= 1,
                "continued_fraction: a must have a ladder-depth dimension, got a 0-dim tensor");
  const int64_t dd = dim < 0 ? dim + n : dim;
  CEMFRAC_CHECK(dd >= 0 && dd < n,
                "continued_fraction: dim = {} is out of range for a {}-dim tensor", dim, n);
  CEMFRAC_CHECK(a.size(dd) >= 1,
                "continued_fraction: the ladder depth a.size({}) must be at least 1, got shape {}",
                dim, c10::str(a.sizes()));
  CEMFRAC_CHECK(at::isFloatingType(a.scalar_type()),
                "continued_fraction: a must be floating point (float32 or float64), got {}",
                std::string(c10::toString(a.scalar_type())));
  CEMFRAC_CHECK(eps >= 0 && std::isfinite(eps),
                "continued_fraction: eps must be finite and >= 0, got {}", eps);
  const ContinuantOptions options = ContinuantOptions()
                                        .eps(eps)
                                        .backward(parse_continuant_backward(backward))
                                        .impl(parse_continuant_impl(impl));
  if (n >= 2 && dd == n - 2) return continuant(a, options);
  const at::Tensor moved = a.movedim(dd, 0);  // (d, rest...)
  std::vector<int64_t> rest(moved.sizes().begin() + 1, moved.sizes().end());
  int64_t ladders = 1;
  for (int64_t s : rest) ladders *= s;
  const at::Tensor f = continuant(moved.reshape({1, a.size(dd), ladders}), options);  // (1, M)
  return f.reshape(rest);
}

// ---- Config fields, from visit_fields
// ------------------------------------------------------------

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, bool>)
    return "bool";
  else if constexpr (std::is_integral_v<T>)
    return "int";
  else if constexpr (std::is_floating_point_v<T>)
    return "float";
  else if constexpr (std::is_same_v<T, std::string> || HasEnumNames<T>::value)
    return "str";  // enum fields travel as their names, as in config.json
  else if constexpr (HasVisitFields<T>::value)
    return "dict";
  else
    return "list";
}

// (path, type, help) of every field of ModelConfig, depth first; a nested struct appears as itself
// ("dict") followed by its fields ("cem.steps").
struct FieldLister {
  std::string prefix;
  std::vector<std::tuple<std::string, std::string, std::string>>* out;
  template <typename F>
  void operator()(const char* key, F& value, const char* help,
                  OnCheckpoint = OnCheckpoint::kFixed) {
    out->emplace_back(prefix + key, type_name<F>(), help);
    if constexpr (HasVisitFields<F>::value) {
      FieldLister nested{prefix + key + ".", out};
      value.visit_fields(nested);
    }
  }
};

std::vector<std::tuple<std::string, std::string, std::string>> model_config_fields() {
  std::vector<std::tuple<std::string, std::string, std::string>> fields;
  ModelConfig probe;
  FieldLister lister{"", &fields};
  probe.visit_fields(lister);
  return fields;
}

ModelConfig config_from(const std::string& config_json, const std::string& source) {
  json j;
  try {
    j = json::parse(config_json);
  } catch (const json::exception& e) {
    fail("{}: options are not valid JSON: {}", source, e.what());
  }
  return model_config_from_json(j, source);
}

// ---- Layers
// --------------------------------------------------------------------------------------

// One mixer or FFN of the registry, built from a ModelConfig as layer 0 of a model would be.
class Layer {
 public:
  Layer(const std::string& family, const std::string& kind, const std::string& config_json,
        const std::string& source)
      : family_(family), source_(source) {
    json j;
    try {
      j = json::parse(config_json);
    } catch (const json::exception& e) {
      fail("{}: options are not valid JSON: {}", source, e.what());
    }
    if (family == "mixer") {
      parse_mixer_kind(kind, source);
      j["mixer"] = kind;
    } else {
      CEMFRAC_CHECK(family == "ffn", "{}: unknown layer family '{}'", source, family);
      parse_ffn_kind(kind, source);
      j["ffn"] = kind;
    }
    config_ = model_config_from_json(j, source);
    build(torch::kCPU);
    if (mixer_ && config_.positions == Positions::kRope) {
      rope_ = std::make_unique<RotaryEmbedding>(config_.head_dim(), config_.context,
                                                config_.rope_theta, config_.rope_scaling);
    }
  }

  // A new module of the same config on `device` (its values are the caller's to set), in the
  // training mode of the old one: how Python's .to("meta") moves a layer, since a CPU tensor cannot
  // become a meta one in place (set_data refuses), and the C++ forward must read the new tensors.
  void rebuild(const std::string& device) {
    const bool training = module().is_training();
    build(parse_device(device, source_ + ".to"));
    module().train(training);
  }

  torch::nn::Module& module() {
    return mixer_ ? static_cast<torch::nn::Module&>(*mixer_)
                  : static_cast<torch::nn::Module&>(*ffn_);
  }

  // x (B, N, D) -> (B, N, D); a mixer reads x as positions offset..offset+N-1.
  at::Tensor forward(const at::Tensor& x, int64_t offset) {
    CEMFRAC_CHECK(x.defined() && x.dim() == 3 && x.size(2) == config_.d_model,
                  "{}: input must be (batch, tokens, d_model = {}), got shape {}", source_,
                  config_.d_model, x.defined() ? c10::str(x.sizes()) : std::string("undefined"));
    const auto params = module().parameters();
    if (!params.empty()) {
      // An input elsewhere would be read through the wrong pointer, or mixed with the weights.
      CEMFRAC_CHECK(x.device() == params[0].device(),
                    "{}: input is on {} but the layer is on {}; move one (e.g. x.to(\"{}\"))",
                    source_, x.device().str(), params[0].device().str(), params[0].device().str());
      CEMFRAC_CHECK(x.scalar_type() == params[0].scalar_type(),
                    "{}: input is {} but the parameters are {}; convert one (e.g. layer.double())",
                    source_, std::string(c10::toString(x.scalar_type())),
                    std::string(c10::toString(params[0].scalar_type())));
    }
    if (ffn_) return ffn_->forward(x);
    CEMFRAC_CHECK(offset >= 0 && x.size(1) >= 1 && offset + x.size(1) <= config_.context,
                  "{}: positions {}..{} are outside the layer's context of {} tokens", source_,
                  offset, offset + x.size(1) - 1, config_.context);
    MixerContext ctx;
    ctx.offset = offset;
    if (rope_) {
      std::lock_guard<std::mutex> lock(rope_mutex_);  // the tables are cached per dtype
      std::tie(ctx.rope_cos, ctx.rope_sin) = rope_->tables(offset, x.size(1), x.options());
    }
    return mixer_->forward(x, ctx);
  }

  const ModelConfig& config() const { return config_; }
  const std::string& family() const { return family_; }

 private:
  void build(torch::Device device) {
    if (family_ == "mixer")
      mixer_ = make_mixer(config_, 0, device);
    else
      ffn_ = make_ffn(config_, 0, device);
  }

  std::string family_;
  std::string source_;
  ModelConfig config_;
  std::shared_ptr<MixerImpl> mixer_;
  std::shared_ptr<FfnImpl> ffn_;
  std::unique_ptr<RotaryEmbedding> rope_;
  std::mutex rope_mutex_;
};

// ---- Models
// --------------------------------------------------------------------------------------

struct Model {
  LmModel model{nullptr};
  std::shared_ptr<Tokenizer> tokenizer;
  std::string checkpoint;
  int64_t step = 0;
};

std::vector<std::pair<std::string, at::Tensor>> named_parameters(torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> named_buffers(torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : m.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

// The buffers checkpoints save (TaggedModule::add_state_buffer); the others (causal masks) follow
// from the config and are not part of a state_dict.
std::vector<std::string> state_buffer_names(torch::nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& item : state_buffers(m)) out.push_back(item.first);
  return out;
}

// ---- A training loop in C++, for the test that the Python loop gives the same losses
// --------------

// The tiny model of python/tests/test_training.py, written again in C++: token embedding E (V, D),
// z = E[tokens]; z += mixer(z); z += ffn(z); logits = z E^T. `state` holds E ("embedding") and the
// layers' parameters ("mixer.<name>", "ffn.<name>") at their initial values. torch::optim::AdamW
// with the given settings, `steps` steps on the same (tokens, targets) batch; returns the loss of
// each step.
std::vector<double> reference_adamw_losses(
    const std::string& mixer_kind, const std::string& ffn_kind, const std::string& config_json,
    const std::vector<std::pair<std::string, at::Tensor>>& state, const at::Tensor& tokens,
    const at::Tensor& targets, int64_t steps, double lr, double weight_decay) {
  Layer mixer("mixer", mixer_kind, config_json, "reference loop");
  Layer ffn("ffn", ffn_kind, config_json, "reference loop");
  at::Tensor embedding;
  std::vector<at::Tensor> params;
  for (const auto& [name, value] : state) {
    torch::NoGradGuard no_grad;
    if (name == "embedding") {
      embedding = value.detach().clone().requires_grad_(true);
      continue;
    }
    const bool is_mixer = name.rfind("mixer.", 0) == 0;
    torch::nn::Module& m = is_mixer ? mixer.module() : ffn.module();
    const std::string local = name.substr(is_mixer ? 6 : 4);
    at::Tensor* p = m.named_parameters().find(local);
    CEMFRAC_CHECK(p != nullptr, "reference loop: no parameter '{}'", name);
    p->copy_(value);
  }
  CEMFRAC_CHECK(embedding.defined(), "reference loop: state has no 'embedding'");
  params.push_back(embedding);
  for (const auto& p : mixer.module().parameters()) params.push_back(p);
  for (const auto& p : ffn.module().parameters()) params.push_back(p);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(lr).weight_decay(weight_decay));
  std::vector<double> losses;
  for (int64_t s = 0; s < steps; ++s) {
    optimizer.zero_grad();
    at::Tensor z =
        embedding.index_select(0, tokens.reshape(-1)).view({tokens.size(0), tokens.size(1), -1});
    z = z + mixer.forward(z, 0);
    z = z + ffn.forward(z, 0);
    const at::Tensor logits = at::matmul(z, embedding.t());
    const at::Tensor loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}), targets.reshape(-1));
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

}  // namespace
}  // namespace cemfrac

PYBIND11_MODULE(_C, m) {
  using namespace cemfrac;
  m.doc() = "cemfrac's C++ engine (LibTorch); use the cemfrac package, not this module directly";

  static py::exception<Error> error(m, "Error", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(error.ptr(), e.what());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });

  m.def("version", [] { return std::string(CEMFRAC_VERSION); });
  m.def("continued_fraction", &continued_fraction, py::arg("a"), py::arg("eps"), py::arg("dim"),
        py::arg("backward"), py::arg("impl"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "continuant_literal",
      [](const at::Tensor& a, double eps) {
        return continuant_literal(a, ContinuantOptions().eps(eps));
      },
      py::arg("a"), py::arg("eps"), py::call_guard<py::gil_scoped_release>());

  m.def(
      "loglikelihood_request",
      [](const Tokenizer& t, const std::string& context, const std::string& continuation) {
        ScoreRequest r = loglikelihood_request(t, context, continuation);
        return std::make_pair(r.tokens, r.score_from);
      },
      py::arg("tokenizer"), py::arg("context"), py::arg("continuation"));
  m.def(
      "rolling_requests",
      [](const Tokenizer& t, const std::string& text, int64_t context, int64_t stride) {
        std::vector<std::pair<std::vector<int64_t>, int64_t>> out;
        for (ScoreRequest& r : rolling_requests(t, text, context, stride))
          out.emplace_back(std::move(r.tokens), r.score_from);
        return out;
      },
      py::arg("tokenizer"), py::arg("text"), py::arg("context"), py::arg("stride") = 0);
  m.def("model_config_fields", &model_config_fields);
  m.def("default_model_config", [] { return to_json(ModelConfig{}).dump(); });
  m.def("mixer_kinds", &mixer_kind_names);
  m.def("ffn_kinds", &ffn_kind_names);
  m.def("validate_model_config", [](const std::string& config_json, const std::string& source) {
    return to_json(config_from(config_json, source)).dump();
  });

  py::class_<Layer, std::shared_ptr<Layer>>(m, "Layer")
      .def(py::init<const std::string&, const std::string&, const std::string&,
                    const std::string&>(),
           py::arg("family"), py::arg("kind"), py::arg("config_json"), py::arg("source"))
      .def("forward", &Layer::forward, py::arg("x"), py::arg("offset") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def("named_parameters", [](Layer& l) { return named_parameters(l.module()); })
      .def("named_buffers", [](Layer& l) { return named_buffers(l.module()); })
      .def("state_buffer_names", [](Layer& l) { return state_buffer_names(l.module()); })
      .def("rebuild", &Layer::rebuild, py::arg("device"))
      .def("train", [](Layer& l, bool mode) { l.module().train(mode); })
      .def("is_training", [](Layer& l) { return l.module().is_training(); })
      .def(
          "on_train_step",
          [](Layer& l, int64_t step, int64_t total, bool dyadic) {
            notify_train_step(l.module(), TrainProgress{step, total, dyadic});
          },
          py::arg("step"), py::arg("total_steps"), py::arg("dyadic") = true)
      .def("config_json", [](Layer& l) { return to_json(l.config()).dump(); })
      .def("describe", [](Layer& l) { return c10::str(l.module()); });

  py::class_<Tokenizer, std::shared_ptr<Tokenizer>>(m, "Tokenizer")
      .def_static(
          "load",
          [](const std::string& dir) { return std::shared_ptr<Tokenizer>(load_tokenizer(dir)); },
          py::arg("dir"))
      .def_static(
          "make",
          [](const std::string& spec) { return std::shared_ptr<Tokenizer>(make_tokenizer(spec)); },
          py::arg("spec"))
      .def_property_readonly("id", &Tokenizer::id)
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def_property_readonly("eot_id", &Tokenizer::eot_id)
      .def(
          "encode", [](const Tokenizer& t, const std::string& text) { return t.encode(text); },
          py::arg("text"), py::call_guard<py::gil_scoped_release>())
      .def(
          "decode_bytes",
          [](const Tokenizer& t, const std::vector<TokenId>& ids) {
            std::string s;
            {
              py::gil_scoped_release release;
              s = t.decode(ids);
            }
            return py::bytes(s);
          },
          py::arg("ids"))
      .def("save", &Tokenizer::save, py::arg("dir"));

  py::class_<Model, std::shared_ptr<Model>>(m, "Model")
      .def_static(
          "load",
          [](const std::string& path, const std::vector<std::string>& overrides,
             const std::string& device) {
            auto out = std::make_shared<Model>();
            // Messages name Python's arguments, not the CLI's --checkpoint / --set.
            LoadedModel loaded = load_model(path, overrides, parse_device(device, "device"),
                                            {"cemfrac.load: path", "cemfrac.load: override"});
            out->model = loaded.model;
            out->tokenizer = std::shared_ptr<Tokenizer>(std::move(loaded.tokenizer));
            out->checkpoint = loaded.checkpoint;
            out->step = loaded.step;
            return out;
          },
          py::arg("path"), py::arg("overrides") = std::vector<std::string>{},
          py::arg("device") = std::string("cpu"))
      .def_static(
          "create",
          [](const std::string& config_json) {
            auto out = std::make_shared<Model>();
            out->model = LmModel(config_from(config_json, "cemfrac.Model"));
            return out;
          },
          py::arg("config_json"))
      .def(
          "forward", [](Model& mo, const at::Tensor& tokens) { return mo.model->forward(tokens); },
          py::arg("tokens"), py::call_guard<py::gil_scoped_release>())
      .def(
          "score",
          // score_requests (cemfrac/eval/tasks.h), what `cemfrac eval --task` scores with: each
          // (tokens, score_from) -> (summed log-likelihood of tokens[score_from:], targets,
          // greedy).
          [](Model& mo, const std::vector<std::pair<std::vector<int64_t>, int64_t>>& requests,
             int64_t batch) {
            std::vector<ScoreRequest> rs;
            for (const auto& [tokens, from] : requests) rs.push_back({tokens, from});
            ScoreOptions o;
            o.context = mo.model->config().context;
            o.batch = batch;
            const torch::Device device = mo.model->head_weight().device();
            LmModel model = mo.model;
            auto logits = [model, device](const torch::Tensor& x) mutable {
              return model->forward(x.to(device));
            };
            std::vector<std::tuple<double, int64_t, bool>> out;
            for (const ScoreResult& r : score_requests(logits, rs, o))
              out.emplace_back(r.loglik, r.tokens, r.greedy);
            return out;
          },
          py::arg("requests"), py::arg("batch") = 8, py::call_guard<py::gil_scoped_release>())
      .def(
          "generate",
          // generate_batch (cemfrac/model/generate.h): the decode cache, one batch, no padding
          // token in the model; per row the tokens generate() gives that prompt alone.
          [](Model& mo, const std::vector<std::vector<int64_t>>& prompts, int64_t max_new_tokens,
             double temperature, int64_t top_k, double top_p, uint64_t seed, int64_t eos_id,
             int64_t vocab_limit) {
            GenerateOptions o;
            o.sampling.temperature = temperature;
            o.sampling.top_k = top_k;
            o.sampling.top_p = top_p;
            o.seed = seed;
            o.max_new_tokens = max_new_tokens;
            o.eos_id = eos_id;
            o.vocab_limit = vocab_limit;
            std::vector<std::vector<int64_t>> out;
            for (GenerateResult& r : generate_batch(*mo.model, prompts, o))
              out.push_back(std::move(r.tokens));
            return out;
          },
          py::arg("prompts"), py::arg("max_new_tokens"), py::arg("temperature") = 0.0,
          py::arg("top_k") = 0, py::arg("top_p") = 1.0, py::arg("seed") = 0, py::arg("eos_id") = -1,
          py::arg("vocab_limit") = -1, py::call_guard<py::gil_scoped_release>())
      .def("named_parameters", [](Model& mo) { return named_parameters(*mo.model); })
      .def("named_buffers", [](Model& mo) { return named_buffers(*mo.model); })
      .def("state_buffer_names", [](Model& mo) { return state_buffer_names(*mo.model); })
      .def(
          "rebuild",
          [](Model& mo, const std::string& device) {
            // As Layer::rebuild: a new module of the same config on `device` (for .to("meta")).
            const bool training = mo.model->is_training();
            mo.model = LmModel(mo.model->config(), parse_device(device, "cemfrac.Model.to"));
            mo.model->train(training);
          },
          py::arg("device"))
      .def("train", [](Model& mo, bool mode) { mo.model->train(mode); })
      .def("is_training", [](Model& mo) { return mo.model->is_training(); })
      .def(
          "on_train_step",
          [](Model& mo, int64_t step, int64_t total, bool dyadic) {
            notify_train_step(*mo.model, TrainProgress{step, total, dyadic});
          },
          py::arg("step"), py::arg("total_steps"), py::arg("dyadic") = true)
      .def("config_json", [](Model& mo) { return to_json(mo.model->config()).dump(); })
      .def_property_readonly("tokenizer", [](Model& mo) { return mo.tokenizer; })
      .def_property_readonly("checkpoint", [](Model& mo) { return mo.checkpoint; })
      .def_property_readonly("step", [](Model& mo) { return mo.step; });

  py::module_ testing = m.def_submodule("_testing", "for cemfrac's own tests");
  testing.def("reference_adamw_losses", &reference_adamw_losses, py::arg("mixer"), py::arg("ffn"),
              py::arg("config_json"), py::arg("state"), py::arg("tokens"), py::arg("targets"),
              py::arg("steps"), py::arg("lr"), py::arg("weight_decay"),
              py::call_guard<py::gil_scoped_release>());
}
