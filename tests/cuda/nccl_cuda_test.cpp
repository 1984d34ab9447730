// The data-parallel path on one GPU (label `cuda`): a one-rank NCCL group (the lent GPU machines
// have one GPU, and NCCL refuses two ranks on one device) through the same DataParallel calls the
// trainer makes. With one rank the mean over ranks is the rank's own gradient, exactly (a sum of one
// term, divided by 1), so the test demands equality: what it proves is that NCCL takes the CUDA
// buckets (overlapped and after backward), the scalars and hash check go through the Gloo side
// group, and the step's timing reaches the observer. Skipped with the reason on a build without
// CUDA, without NCCL or without a visible GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "cemfrac/dist/process_group.h"
#include "cemfrac/model/lm_model.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/model_test_util.h"

namespace cemfrac::test {
namespace {

struct CountingObserver : ReduceObserver {
  int steps = 0;
  ReduceTiming last;
  void on_step_reduced(const ReduceTiming& t) override {
    ++steps;
    last = t;
  }
};

TEST(NcclCuda, OneRankGroupReducesGradientsOnTheGpu) {
  const std::string why = cuda_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  if (!dist_has_nccl()) GTEST_SKIP() << "this LibTorch was built without NCCL";
  StoreServer store("127.0.0.1", 0, 30);
  DistEnv env;
  env.port = store.port();
  env.agent_store = true;
  DistOptions o;
  o.group_for_one_rank = true;
  o.connect_timeout_s = 30;
  o.collective_timeout_s = 60;
  o.bucket_bytes = 2048;  // several buckets
  const c10::Device gpu(c10::kCUDA, 0);
  DistContext dist(env, o, gpu);
  ASSERT_TRUE(dist.active());
  EXPECT_EQ(dist.backend(), "nccl");
  CountingObserver observer;
  dist.set_observer(&observer);

  const ModelConfig c = tiny_model(40, 32, 8);
  torch::manual_seed(7);
  LmModel model(c, gpu);
  std::vector<torch::Tensor> params = model->parameters();
  const torch::Tensor before = params.front().detach().cpu().clone();
  dist.broadcast_from_rank0(params, "parameters");
  EXPECT_TRUE(torch::equal(params.front().detach().cpu(), before));

  for (const bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlapped" : "after backward");
    dist.attach_gradients(params, overlap);
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
    const torch::Tensor tokens = torch::randint(0, c.vocab_size, {2, 9}, torch::kInt64).to(gpu);
    const torch::Tensor logits = model->forward(tokens.narrow(1, 0, 8));
    dist.before_last_backward(1);
    torch::cross_entropy_loss(logits.reshape({-1, c.vocab_size}),
                              tokens.narrow(1, 1, 8).reshape({-1}))
        .backward();
    std::vector<torch::Tensor> local;
    for (const auto& p : params) local.push_back(p.grad().detach().cpu().clone());
    dist.reduce_gradients();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(params[i].grad().is_cuda());
      EXPECT_TRUE(torch::equal(params[i].grad().cpu(), local[i])) << "parameter " << i;
    }
    const std::vector<double> sums = dist.allreduce_sum({1.5, -2.0}, "loss", true);
    EXPECT_EQ(sums, (std::vector<double>{1.5, -2.0}));
  }
  EXPECT_EQ(observer.steps, 2);
  EXPECT_GE(observer.last.seconds, observer.last.exposed_seconds);
  EXPECT_GT(observer.last.exposed_seconds, 0.0);
  dist.finish();
}

}  // namespace
}  // namespace cemfrac::test
