// gtest main: deterministic seed and one ATen thread unless a test asks for more.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  at::set_num_threads(1);
  torch::manual_seed(1234);
  return RUN_ALL_TESTS();
}
