// make_data_parallel: c10d's DataParallel, wrapped by the decorator a test executable may set.
#include "cemfrac/dist/data_parallel.h"

#include <utility>

#include "cemfrac/dist/process_group.h"

namespace cemfrac {
namespace {

DataParallelDecorator& decorator() {
  static DataParallelDecorator d;
  return d;
}

}  // namespace

std::unique_ptr<DataParallel> make_data_parallel(const DistEnv& env, const DistOptions& options,
                                                 const torch::Device& device) {
  std::unique_ptr<DataParallel> dp = std::make_unique<DistContext>(env, options, device);
  if (decorator()) dp = decorator()(std::move(dp));
  return dp;
}

void set_data_parallel_decorator(DataParallelDecorator d) {
  decorator() = std::move(d);
}

}  // namespace cemfrac
