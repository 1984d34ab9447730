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
    nullptr,
};

}  // namespace

c10::OperatorHandle find_op(const char* name) {
  // Reading the anchors (values unknown to this file's compiler) is what references their objects.
  static const bool all_linked = kContinuantKernels;
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
