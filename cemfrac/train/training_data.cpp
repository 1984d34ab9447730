#include "cemfrac/train/training_data.h"

#include <c10/util/Exception.h>

namespace cemfrac {

TrainBatch TrainingData::validation_batch(int64_t k) const {
  TORCH_INTERNAL_ASSERT(false, "validation batch ", k, " of data without a validation set");
  return {};
}

LossFn cross_entropy_loss() {
  return [](const torch::Tensor& logits, const torch::Tensor& targets, int64_t reduction) {
    const int64_t V = logits.size(-1);
    // The ATen op's other defaults (no weight, ignore_index -100, no smoothing) are
    // torch::nn::functional::cross_entropy's.
    return torch::cross_entropy_loss(logits.reshape({-1, V}), targets.reshape({-1}),
                                     /*weight=*/{}, reduction, /*ignore_index=*/-100,
                                     /*label_smoothing=*/0.0);
  };
}

LossFn mse_loss() {
  return [](const torch::Tensor& output, const torch::Tensor& targets, int64_t reduction) {
    return torch::mse_loss(output, targets, reduction);
  };
}

}  // namespace cemfrac
