// What each parameter is, declared where it is created. A layer registers its tensors through
// TaggedModule::add_parameter(name, tensor, kind, group); the model's parameter table and the
// optimizer's groups are read from these tags, so a parameter without a tag is a bug (asserted).
#pragma once
#include <torch/nn/module.h>
#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace cemfrac {

// What a parameter is, for the parameter table and the optimizer groups.
enum class ParamKind { kEmbedding, kAttention, kFfn, kNorm, kHead };
// kDecay: matrices. kNoDecay: norms, biases, embeddings (and later CEM eta/delta/p, ladder biases).
// kFrozen: no update, no decay, no optimizer state (later: ladder depths before their dyadic step).
enum class ParamGroup { kDecay, kNoDecay, kFrozen };

const char* to_string(ParamKind kind);
const char* to_string(ParamGroup group);

struct ParamInfo {
  std::string name;  // checkpoint key, e.g. "blocks.3.attn.w_qkv"
  std::vector<int64_t> shape;
  int64_t numel = 0;
  ParamKind kind = ParamKind::kAttention;
  ParamGroup group = ParamGroup::kDecay;
  std::string tied_to;  // non-empty when this entry shares storage with another (counted once)
  // Ladder depth i >= 1 of a CoFrGeNet tensor: under the dyadic schedule (train.dyadic) it stays
  // frozen until step ceil(t (1 - 2^-i)), then joins `group`. 0: trained from the first step.
  int64_t depth = 0;
};

struct ParamTag {
  ParamKind kind;
  ParamGroup group;
  int64_t depth = 0;  // see ParamInfo::depth
};

// Where a training run is, told to every TaggedModule before each optimizer step (the hook for
// layers whose behaviour depends on the step: CoFrGeNet's truncated dyadic stages, the window in
// which ladder output ranges are recorded for eval-time clipping).
struct TrainProgress {
  int64_t step = 0;         // 0-based index of the step about to run
  int64_t total_steps = 1;  // t, the run's train.steps
  bool dyadic = true;       // train.dyadic: ladder depths activate at ceil(t (1 - 2^-i))
};

// Base of every layer module that owns parameters.
class TaggedModule : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;

  // (local name, tag) of the parameters this module registered itself, in registration order.
  const std::vector<std::pair<std::string, ParamTag>>& param_tags() const { return tags_; }
  // Local names of the buffers registered with add_state_buffer, in registration order.
  const std::vector<std::string>& state_buffer_names() const { return state_buffers_; }

  // Called by the trainer before every optimizer step (TrainProgress). Default: nothing.
  virtual void on_train_step(const TrainProgress& progress) { (void)progress; }

 protected:
  // `depth` >= 1 marks a ladder-depth tensor of the dyadic schedule (ParamInfo::depth).
  torch::Tensor add_parameter(const std::string& name, const torch::Tensor& value, ParamKind kind,
                              ParamGroup group, int64_t depth = 0) {
    tags_.emplace_back(name, ParamTag{kind, group, depth});
    return register_parameter(name, value);
  }
  // Non-trainable state that checkpoints save beside the parameters (not counted as parameters).
  torch::Tensor add_state_buffer(const std::string& name, const torch::Tensor& value) {
    state_buffers_.push_back(name);
    return register_buffer(name, value);
  }

 private:
  std::vector<std::pair<std::string, ParamTag>> tags_;
  std::vector<std::string> state_buffers_;
};

// Every add_state_buffer tensor under `root`, by full name ("blocks.0.mlp.z_min"), in module order.
std::vector<std::pair<std::string, torch::Tensor>> state_buffers(const torch::nn::Module& root);
// Calls on_train_step on every TaggedModule under `root`.
void notify_train_step(torch::nn::Module& root, const TrainProgress& progress);
// One ParamInfo per entry of root.named_parameters() (each distinct tensor once), in registration
// order, with the kind/group/depth its TaggedModule declared (tied_to left empty). A parameter
// registered without a tag trips an assertion. The parameter table of LmModel and of the GP model.
std::vector<ParamInfo> tagged_parameter_table(const torch::nn::Module& root);

// Initial values. On the meta device (shape-only models, see LmModelImpl) nothing is allocated or
// drawn; otherwise values come from the default CPU generator, in the order of the calls, on every
// device (a seed gives the same weights on the CPU and on a GPU).
torch::Tensor init_normal(torch::IntArrayRef shape, double std, torch::Device device);
torch::Tensor init_constant(torch::IntArrayRef shape, double value, torch::Device device);

}  // namespace cemfrac
