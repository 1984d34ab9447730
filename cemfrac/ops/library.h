// The cemfrac operator library: every fused op is a dispatcher operator cemfrac::<name>
// (torch.ops.cemfrac.<name> in Python), declared once with its schema in library.cpp's
// TORCH_LIBRARY(cemfrac) and given kernels per dispatch key by its own ops/<op>.cpp:
//
//   CPU                        the fused loops of kernels/cpu/ (allocation and reshaping here)
//   Meta                       shapes and dtypes only (the meta device, torch.compile's fake tensors)
//   CompositeExplicitAutograd  the ATen twin: every other backend (CUDA until kernels/cuda/ has a
//                              kernel, MPS, ...). Explicit, not Implicit: an Implicit kernel is a
//                              decomposition that autograd and torch.compile's tracing run in place
//                              of the op; the op must stay one node whose derivative is the closed
//                              form below, on every device alike
//   Autograd                   a torch::autograd::Function whose backward is the closed form,
//                              itself an operator (so a CUDA backward is one more registration too)
//
// The engine calls the operators through typed dispatcher handles (op<Signature>()); no ops/*.cpp
// branches on a tensor's device. A CUDA kernel is one TORCH_LIBRARY_IMPL(cemfrac, CUDA, m) block
// naming the same schema (docs/python.md, "Operators").
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>

namespace cemfrac::ops {

/// The operator cemfrac::<name> (default overload). Throws c10::Error if it is not registered.
c10::OperatorHandle find_op(const char* name);

/// A typed handle to cemfrac::<name>; Signature is the schema's C++ signature, e.g.
/// at::Tensor(const at::Tensor&, double). Handles are cheap to copy; callers keep one static.
template <class Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return find_op(name).typed<Signature>();
}

/// The schemas registered by TORCH_LIBRARY(cemfrac), one per line (for `cemfrac info` and tests).
const char* const* op_schemas();

}  // namespace cemfrac::ops
