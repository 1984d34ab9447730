#include "cemfrac/core/meta_kernels.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/WrapDimMinimal.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <vector>

namespace cemfrac {

namespace {

using Stack = torch::jit::Stack;

int64_t int_of(const c10::IValue& v) {
  return v.isInt() ? v.toInt() : v.toSymInt().expect_int();
}

std::vector<int64_t> ints_of(const c10::IValue& v) {
  std::vector<int64_t> out;
  for (const c10::IValue& e : v.toListRef()) out.push_back(int_of(e));
  return out;
}

at::Tensor empty_meta(at::IntArrayRef sizes, const at::Tensor& like) {
  return at::empty(sizes, like.options().device(c10::kMeta));
}

// relu(Tensor self) -> Tensor
void relu_meta(const c10::OperatorHandle&, Stack* stack) {
  const at::Tensor self = torch::jit::pop(*stack).toTensor();
  torch::jit::push(*stack, at::empty_like(self));
}

// where.self(Tensor condition, Tensor self, Tensor other) -> Tensor: the broadcast shape, in the
// promoted dtype of self and other.
void where_meta(const c10::OperatorHandle&, Stack* stack) {
  const at::Tensor other = torch::jit::pop(*stack).toTensor();
  const at::Tensor self = torch::jit::pop(*stack).toTensor();
  const at::Tensor condition = torch::jit::pop(*stack).toTensor();
  const std::vector<int64_t> shape =
      at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  torch::jit::push(*stack, at::empty(shape, self.options().dtype(at::result_type(self, other))));
}

// index_select(Tensor self, int dim, Tensor index) -> Tensor: size(dim) becomes index.numel().
void index_select_meta(const c10::OperatorHandle&, Stack* stack) {
  const at::Tensor index = torch::jit::pop(*stack).toTensor();
  const int64_t dim = torch::jit::pop(*stack).toInt();
  const at::Tensor self = torch::jit::pop(*stack).toTensor();
  std::vector<int64_t> sizes = self.sizes().vec();
  if (!sizes.empty()) sizes[c10::maybe_wrap_dim(dim, self.dim())] = index.numel();
  torch::jit::push(*stack, empty_meta(sizes, self));
}

// embedding_dense_backward(Tensor grad_output, Tensor indices, SymInt num_weights,
//                          int padding_idx, bool scale_grad_by_freq) -> Tensor
void embedding_dense_backward_meta(const c10::OperatorHandle&, Stack* stack) {
  torch::jit::pop(*stack);  // scale_grad_by_freq
  torch::jit::pop(*stack);  // padding_idx
  const int64_t num_weights = int_of(torch::jit::pop(*stack));
  torch::jit::pop(*stack);  // indices
  const at::Tensor grad = torch::jit::pop(*stack).toTensor();
  torch::jit::push(*stack, empty_meta({num_weights, grad.size(-1)}, grad));
}

// native_layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean,
//   Tensor rstd, Tensor? weight, Tensor? bias, bool[3] output_mask) -> (Tensor, Tensor, Tensor)
void native_layer_norm_backward_meta(const c10::OperatorHandle&, Stack* stack) {
  const c10::List<bool> mask = torch::jit::pop(*stack).toBoolList();
  const c10::IValue bias = torch::jit::pop(*stack);
  const c10::IValue weight = torch::jit::pop(*stack);
  torch::jit::pop(*stack);  // rstd
  torch::jit::pop(*stack);  // mean
  const std::vector<int64_t> normalized = ints_of(torch::jit::pop(*stack));
  const at::Tensor input = torch::jit::pop(*stack).toTensor();
  torch::jit::pop(*stack);  // grad_out
  auto like = [&](const c10::IValue& t, bool wanted, at::IntArrayRef shape) {
    if (!wanted) return at::Tensor();
    return t.isTensor() ? at::empty_like(t.toTensor()) : empty_meta(shape, input);
  };
  torch::jit::push(*stack, mask[0] ? at::empty_like(input) : at::Tensor());
  torch::jit::push(*stack, like(weight, mask[1], normalized));
  torch::jit::push(*stack, like(bias, mask[2], normalized));
}

// abs.out(Tensor self, *, Tensor(a!) out) -> Tensor(a!) (abs itself runs through it).
void abs_out_meta(const c10::OperatorHandle&, Stack* stack) {
  at::Tensor out = torch::jit::pop(*stack).toTensor();
  const at::Tensor self = torch::jit::pop(*stack).toTensor();
  out.resize_(self.sizes());
  torch::jit::push(*stack, out);
}

// native_batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean,
//   Tensor? running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor):
// LayerNorm off the CPU and CUDA (math_native_layer_norm) runs through it. The saved statistics
// have one entry per channel (dimension 1) in training, none otherwise, as the CPU kernel's.
void native_batch_norm_meta(const c10::OperatorHandle&, Stack* stack) {
  torch::jit::pop(*stack);  // eps
  torch::jit::pop(*stack);  // momentum
  const bool training = torch::jit::pop(*stack).toBool();
  for (int i = 0; i < 4; ++i) torch::jit::pop(*stack);  // running_var .. weight
  const at::Tensor input = torch::jit::pop(*stack).toTensor();
  const int64_t channels = input.dim() > 1 ? input.size(1) : 1;
  torch::jit::push(*stack, at::empty_like(input));
  torch::jit::push(*stack, empty_meta({training ? channels : 0}, input));
  torch::jit::push(*stack, empty_meta({training ? channels : 0}, input));
}

struct MetaKernel {
  const char* name;
  const char* overload;
  torch::CppFunction (*make)();
};

template <c10::BoxedKernel::BoxedKernelFunction* fn>
torch::CppFunction boxed() {
  return torch::CppFunction::makeFromBoxedFunction<fn>();
}

}  // namespace

void ensure_meta_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    static std::unique_ptr<torch::Library> library;
    const MetaKernel kernels[] = {
        {"aten::relu", "", &boxed<&relu_meta>},
        {"aten::where", "self", &boxed<&where_meta>},
        {"aten::index_select", "", &boxed<&index_select_meta>},
        {"aten::embedding_dense_backward", "", &boxed<&embedding_dense_backward_meta>},
        {"aten::native_layer_norm_backward", "", &boxed<&native_layer_norm_backward_meta>},
        {"aten::abs", "out", &boxed<&abs_out_meta>},
        {"aten::native_batch_norm", "", &boxed<&native_batch_norm_meta>},
    };
    for (const MetaKernel& k : kernels) {
      const auto op = c10::Dispatcher::singleton().findSchema({k.name, k.overload});
      if (!op.has_value() || op->hasKernelForDispatchKey(c10::DispatchKey::Meta)) continue;
      if (!library) {
        library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                   c10::DispatchKey::Meta, __FILE__, __LINE__);
      }
      const std::string name =
          std::string(k.name + 6) + (k.overload[0] != '\0' ? std::string(".") + k.overload : "");
      library->impl(name.c_str(), k.make());
    }
  });
}

}  // namespace cemfrac
