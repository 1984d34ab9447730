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
  std::string name;   // checkpoint key, e.g. "blocks.3.attn.w_qkv"
  std::vector<int64_t> shape;
  int64_t numel = 0;
  ParamKind kind = ParamKind::kAttention;
  ParamGroup group = ParamGroup::kDecay;
  std::string tied_to;  // non-empty when this entry shares storage with another (counted once)
};

struct ParamTag {
  ParamKind kind;
  ParamGroup group;
};

// Base of every layer module that owns parameters.
class TaggedModule : public torch::nn::Module {
 public:
  using torch::nn::Module::Module;

  // (local name, tag) of the parameters this module registered itself, in registration order.
  const std::vector<std::pair<std::string, ParamTag>>& param_tags() const { return tags_; }

 protected:
  torch::Tensor add_parameter(const std::string& name, const torch::Tensor& value, ParamKind kind,
                              ParamGroup group) {
    tags_.emplace_back(name, ParamTag{kind, group});
    return register_parameter(name, value);
  }

 private:
  std::vector<std::pair<std::string, ParamTag>> tags_;
};

// Initial values. On the meta device (shape-only models, see LmModelImpl) nothing is allocated or
// drawn; otherwise values come from the default generator, in the order of the calls.
torch::Tensor init_normal(torch::IntArrayRef shape, double std, torch::Device device);
torch::Tensor init_constant(torch::IntArrayRef shape, double value, torch::Device device);

}  // namespace cemfrac
