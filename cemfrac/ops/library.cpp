// TORCH_LIBRARY(cemfrac): the one place where the operators' schemas are declared (library.h). The
// kernels are registered next to each op (ops/<op>.cpp, TORCH_LIBRARY_IMPL blocks); the dispatcher
// accepts them in any order of static initialisation.
#include "cemfrac/ops/library.h"

#include <torch/library.h>

namespace cemfrac {
// Each op's .cpp defines one of these; naming them here makes the linker keep those objects (and
// their static registrations) in every binary that calls any operator, although libcemfrac is a
// static archive whose unreferenced objects would otherwise be dropped.
extern const bool kContinuantKernels;
extern const bool kRmsNormKernels;
extern const bool kSiluMulKernels;
extern const bool kRopeKernels;
extern const bool kSymmetricGramKernels;
extern const bool kLinearKernels;
extern const bool kCausalAttentionKernels;
extern const bool kCausalAttentionSharedBiasKernels;
extern const bool kCausalAttentionHeadDiagKernels;

}  // namespace cemfrac

namespace cemfrac::ops {
namespace {

// Argument names follow the C++ functions of ops/*.h. `float` in a schema is a C++ double.
constexpr const char* kSchemas[] = {
    // Ladders (ops/continuant.h). continuant_forward also returns r = 1/K̂_d and, when asked, the
    // continuants K_{d-k} (else a tensor of no elements): what the backward reads.
    "continuant(Tensor a, float eps, bool exact=False, bool save_continuants=False) -> Tensor",
    "continuant_forward(Tensor a, float eps, bool save_continuants=False) -> (Tensor, Tensor, "
    "Tensor)",
    "continuant_backward(Tensor grad_f, Tensor a, Tensor r, Tensor k, float eps, bool exact) -> "
    "Tensor",
    // RMSNorm (ops/rms_norm.h); rms_norm_forward also returns r = 1/rms per row.
    "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor",
    "rms_norm_forward(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)",
    "rms_norm_backward(Tensor grad_y, Tensor x, Tensor weight, Tensor r, float eps) -> (Tensor, "
    "Tensor)",
    // The SiLU gate silu(a) * b (ops/silu_mul.h).
    "silu_mul(Tensor a, Tensor b) -> Tensor",
    "silu_mul_backward(Tensor grad, Tensor a, Tensor b) -> (Tensor, Tensor)",
    // Rotary embedding (ops/rope.h); its backward is itself with inverse flipped.
    "rope(Tensor x, Tensor cos, Tensor sin, bool inverse=False) -> Tensor",
    // W W^T (ops/symmetric_gram.h); its backward is one matmul in tensor ops.
    "symmetric_gram(Tensor w) -> Tensor",
    // x W^T + b with gemv / the skinny kernel for a few rows (ops/linear.h).
    "linear(Tensor x, Tensor weight, Tensor? bias=None) -> Tensor",
    // Causal attention over full sequences (ops/causal_attention.h), out in the merged-heads layout
    // (B, N, H, d_h). The _forward ops also return what the backward reads (the probabilities
    // P (B, H, N, N); the heads' sum (B, N, N) or the per-head read-outs (B, H, N, D)). tied: v is
    // k, and the backward's dk holds both gradients (its dv has no elements).
    "causal_attention(Tensor q, Tensor k, Tensor v) -> Tensor",
    "causal_attention_forward(Tensor q, Tensor k, Tensor v) -> (Tensor, Tensor)",
    "causal_attention_backward(Tensor d_out, Tensor q, Tensor k, Tensor v, Tensor p, bool tied) "
    "-> (Tensor, Tensor, Tensor)",
    "causal_attention_shared_bias(Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor r) -> "
    "(Tensor, Tensor)",
    "causal_attention_shared_bias_forward(Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, "
    "Tensor r) -> (Tensor, Tensor, Tensor, Tensor)",
    "causal_attention_shared_bias_backward(Tensor d_out, Tensor d_read, Tensor q, Tensor k, "
    "Tensor v, Tensor a, Tensor b, Tensor r, Tensor p, Tensor psum, bool tied) -> (Tensor, "
    "Tensor, Tensor, Tensor, Tensor, Tensor)",
    "causal_attention_head_diag(Tensor q, Tensor k, Tensor v, Tensor x, Tensor h, Tensor delta) "
    "-> (Tensor, Tensor)",
    "causal_attention_head_diag_forward(Tensor q, Tensor k, Tensor v, Tensor x, Tensor h, "
    "Tensor delta) -> (Tensor, Tensor, Tensor, Tensor)",
    "causal_attention_head_diag_backward(Tensor d_out, Tensor d_diag, Tensor q, Tensor k, "
    "Tensor v, Tensor x, Tensor h, Tensor delta, Tensor p, Tensor read, bool tied) -> (Tensor, "
    "Tensor, Tensor, Tensor, Tensor, Tensor)",
    nullptr,
};

}  // namespace

c10::OperatorHandle find_op(const char* name) {
  // Reading the anchors (values unknown to this file's compiler) is what references their objects.
  static const bool all_linked = kContinuantKernels && kRmsNormKernels && kSiluMulKernels &&
                                 kRopeKernels && kSymmetricGramKernels && kLinearKernels &&
                                 kCausalAttentionKernels && kCausalAttentionSharedBiasKernels &&
                                 kCausalAttentionHeadDiagKernels;
  TORCH_INTERNAL_ASSERT(all_linked);
  return c10::Dispatcher::singleton().findSchemaOrThrow((std::string("cemfrac::") + name).c_str(),
                                                        "");
}

const char* const* op_schemas() {
  return kSchemas;
}

}  // namespace cemfrac::ops

TORCH_LIBRARY(cemfrac, m) {
  for (const char* const* schema = cemfrac::ops::kSchemas; *schema != nullptr; ++schema) {
    m.def(*schema);
  }
}
