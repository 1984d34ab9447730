// Fault injection for the data-parallel tests, linked only into the test executable
// `cemfrac_faults` (tests/CMakeLists.txt: the CLI plus this file). At start-up it sets a decorator
// (dist/data_parallel.h) that wraps the trainer's DataParallel object when
// CEMFRAC_FAULT=RANK:STEP:ACTION is set:
//   kill  SIGKILL this rank before the last backward pass of step STEP (a crashed rank)
//   hang  sleep forever there (a rank alive but stuck)
//   nan   make that backward's gradient of the first trainable parameter NaN on this rank (a
//         tensor hook, removed after the step), so that the all-reduced gradient is NaN everywhere
// Everything else is passed to the wrapped object unchanged.
#include <signal.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cemfrac/core/check.h"
#include "cemfrac/dist/data_parallel.h"

namespace cemfrac {
namespace {

struct Fault {
  int64_t rank = -1;
  int64_t step = -1;
  std::string action;
};

Fault fault_from_environment() {
  Fault f;
  const char* v = std::getenv("CEMFRAC_FAULT");
  if (v == nullptr || *v == '\0') return f;
  long long r = -1, s = -1;
  char action[16] = {0};
  CEMFRAC_CHECK(std::sscanf(v, "%lld:%lld:%15s", &r, &s, action) == 3,
                "CEMFRAC_FAULT='{}' is not RANK:STEP:kill|hang|nan", v);
  f.rank = r;
  f.step = s;
  f.action = action;
  CEMFRAC_CHECK(f.action == "kill" || f.action == "hang" || f.action == "nan",
                "CEMFRAC_FAULT='{}' is not RANK:STEP:kill|hang|nan", v);
  return f;
}

class FaultyDataParallel final : public DataParallel {
 public:
  FaultyDataParallel(std::unique_ptr<DataParallel> inner, Fault fault)
      : inner_(std::move(inner)), fault_(std::move(fault)) {}

  bool active() const override { return inner_->active(); }
  int64_t rank() const override { return inner_->rank(); }
  int64_t world_size() const override { return inner_->world_size(); }
  std::string backend() const override { return inner_->backend(); }
  std::string describe() const override { return inner_->describe(); }
  void check_same(const std::string& what, const std::string& value) override {
    inner_->check_same(what, value);
  }
  void broadcast_from_rank0(const std::vector<torch::Tensor>& tensors,
                            const std::string& what) override {
    inner_->broadcast_from_rank0(tensors, what);
  }
  void broadcast(const std::vector<torch::Tensor>& tensors, int64_t root,
                 const std::string& what) override {
    inner_->broadcast(tensors, root, what);
  }
  void send_to_rank0(const std::vector<torch::Tensor>& tensors, int64_t from,
                     const std::string& what) override {
    inner_->send_to_rank0(tensors, from, what);
  }
  void attach_gradients(const std::vector<torch::Tensor>& params, bool overlap,
                        const std::vector<int64_t>& owners = {}) override {
    params_ = params;
    inner_->attach_gradients(params, overlap, owners);
  }
  void before_last_backward(int64_t step) override {
    if (fault_.rank == rank() && fault_.step == step) inject();
    inner_->before_last_backward(step);
  }
  void reduce_gradients() override {
    inner_->reduce_gradients();
    if (poisoned_.defined()) {
      poisoned_.remove_hook(hook_);
      poisoned_ = torch::Tensor();
    }
  }
  std::vector<double> allreduce_sum(const std::vector<double>& values, const std::string& what,
                                    bool end_of_step) override {
    return inner_->allreduce_sum(values, what, end_of_step);
  }
  void finish() override { inner_->finish(); }
  void set_observer(ReduceObserver* observer) override { inner_->set_observer(observer); }

 private:
  void inject() {
    if (fault_.action == "kill") std::raise(SIGKILL);
    if (fault_.action == "hang") {
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    for (const torch::Tensor& p : params_) {
      if (!p.requires_grad()) continue;
      poisoned_ = p;
      hook_ = poisoned_.register_hook([](const torch::Tensor& grad) {
        return torch::full_like(grad, std::numeric_limits<double>::quiet_NaN());
      });
      return;
    }
  }

  std::unique_ptr<DataParallel> inner_;
  Fault fault_;
  std::vector<torch::Tensor> params_;
  torch::Tensor poisoned_;  // the parameter carrying the NaN hook during the faulty step
  unsigned hook_ = 0;
};

[[maybe_unused]] const bool kInstalled = [] {
  set_data_parallel_decorator([](std::unique_ptr<DataParallel> inner) {
    Fault fault = fault_from_environment();
    if (fault.rank < 0) return inner;
    return std::unique_ptr<DataParallel>(
        std::make_unique<FaultyDataParallel>(std::move(inner), std::move(fault)));
  });
  return true;
}();

}  // namespace
}  // namespace cemfrac
