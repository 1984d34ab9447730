// c10d plumbing for data-parallel training (see process_group.h). The only file that includes c10d
// headers; CMake gives it USE_C10D_GLOO.
#define CEMFRAC_COMPAT_C10D 1
#include "cemfrac/dist/process_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "cemfrac/core/check.h"
#include "cemfrac/core/compat.h"

namespace cemfrac {
namespace {

using Ms = std::chrono::milliseconds;
constexpr Ms kHeartbeat{200};

Ms to_ms(double seconds) {
  return Ms(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

// First line of an exception text (c10 errors carry backtraces on later lines).
std::string first_line(const std::string& s) {
  std::string line = s.substr(0, s.find('\n'));
  return line.size() > 300 ? line.substr(0, 300) + "..." : line;
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const DistEnv& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (is_loopback(env.master_addr))
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

c10::intrusive_ptr<c10d::Store> connect_store(const DistEnv& env, double timeout_s, bool server) {
  c10d::TCPStoreOptions o = compat::tcp_store_options();
  o.port = static_cast<std::uint16_t>(env.port);
  o.isServer = server;
  o.numWorkers = static_cast<std::size_t>(env.world_size);
  o.waitWorkers = false;
  o.timeout = to_ms(timeout_s);
  c10::intrusive_ptr<c10d::Store> tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
  return c10::make_intrusive<c10d::PrefixStore>(
      fmt::format("cemfrac/attempt_{}", env.restart_count), tcp);
}

std::vector<uint8_t> to_bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string from_bytes(const std::vector<uint8_t>& b) {
  return {b.begin(), b.end()};
}

// FNV-1a over the tensors' bytes (contiguous CPU copies).
uint64_t bytes_hash(const std::vector<torch::Tensor>& tensors) {
  uint64_t h = 1469598103934665603ull;
  for (const torch::Tensor& t : tensors) {
    if (!t.defined()) continue;
    const torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
    const auto* p = static_cast<const unsigned char*>(c.data_ptr());
    const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

// One contiguous 1-D tensor of the bucket's values, and back.
torch::Tensor flatten(const std::vector<torch::Tensor>& bucket) {
  std::vector<torch::Tensor> v;
  for (const auto& t : bucket) v.push_back(t.detach().reshape({-1}));
  return torch::cat(v);
}
void unflatten(const torch::Tensor& flat, const std::vector<torch::Tensor>& bucket) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& t : bucket) {
    t.detach().copy_(flat.narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
}

// Consecutive runs of defined tensors of one dtype and device, each at most `bytes` (a single
// larger tensor makes its own bucket).
std::vector<std::vector<torch::Tensor>> buckets(const std::vector<torch::Tensor>& tensors,
                                                int64_t bytes) {
  std::vector<std::vector<torch::Tensor>> out;
  int64_t size = 0;
  for (const torch::Tensor& t : tensors) {
    if (!t.defined()) continue;
    const int64_t b = t.numel() * static_cast<int64_t>(t.element_size());
    if (out.empty() || out.back().front().scalar_type() != t.scalar_type() ||
        out.back().front().device() != t.device() || size + b > bytes) {
      out.emplace_back();
      size = 0;
    }
    out.back().push_back(t);
    size += b;
  }
  return out;
}

// SIGINT/SIGTERM blocked in this thread while it lives, so that threads started meanwhile (Gloo's
// I/O loop, the heartbeat) inherit the mask: the stop signals then reach only the main thread, and
// no Gloo socket call is interrupted by them.
class BlockStopSignals {
 public:
  BlockStopSignals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~BlockStopSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

}  // namespace

bool dist_has_gloo() {
  return true;
}
bool dist_has_nccl() {
  return compat::kHaveNccl;
}

struct DistContext::Impl {
  DistEnv env;
  DistOptions options;
  c10::intrusive_ptr<c10d::Store> store;
  compat::C10dBackendPtr pg;
  std::string backend = "gloo";
  int64_t seq = 0;  // collectives started, for telling a hung peer from a slow one
  bool broken = false;
  // Gloo for CPU tensors; for CUDA tensors NCCL, with `side` (Gloo) for the scalars and the hash
  // check. On the CPU side is pg.
  compat::C10dBackendPtr side;
  // This step's reductions so far (seconds, exposed seconds), reported at its end.
  ReduceTiming step_timing;
  ReduceObserver* observer = nullptr;

  void add_timing(double seconds, double exposed) {
    step_timing.seconds += seconds;
    step_timing.exposed_seconds += exposed;
  }
  // Shared with the heartbeat thread, which may outlive this object when it is detached.
  std::shared_ptr<std::atomic<bool>> stop_heartbeat = std::make_shared<std::atomic<bool>>(false);
  std::thread heartbeat;

  std::string key(const char* what, int64_t rank) const { return fmt::format("{}/{}", what, rank); }

  // Every kHeartbeat, adds 1 to hb/<rank> on its own store connection. Ends quietly when the store
  // goes away (the job is ending or has failed; the main thread reports that).
  void start_heartbeat() {
    c10::intrusive_ptr<c10d::Store> own = connect_store(env, options.connect_timeout_s, false);
    const std::string k = key("hb", env.rank);
    heartbeat = std::thread([stop = stop_heartbeat, own, k] {
      try {
        while (!stop->load()) {
          own->add(k, 1);
          std::this_thread::sleep_for(kHeartbeat);
        }
      } catch (...) {
      }
    });
  }

  void stop() {
    stop_heartbeat->store(true);
    if (heartbeat.joinable()) {
      if (broken)
        heartbeat.detach();  // its store call may wait on a dead host; the process is exiting
      else
        heartbeat.join();
    }
  }

  // Why a collective failed, in words naming the rank(s).
  std::string diagnose() {
    try {
      const int64_t w = env.world_size;
      std::vector<int64_t> before(w), after(w);
      for (int64_t r = 0; r < w; ++r) before[r] = store->add(key("hb", r), 0);
      std::this_thread::sleep_for(5 * kHeartbeat);
      for (int64_t r = 0; r < w; ++r) after[r] = store->add(key("hb", r), 0);
      std::vector<std::string> lost, behind;
      for (int64_t r = 0; r < w; ++r) {
        if (r == env.rank) continue;
        if (after[r] == before[r]) {
          lost.push_back(std::to_string(r));
          continue;
        }
        const int64_t their = std::stoll(from_bytes(store->get(key("seq", r))));
        if (their < seq) behind.push_back(std::to_string(r));
      }
      if (!lost.empty())
        return fmt::format("lost rank {} (no heartbeat for {} ms: killed or crashed)",
                           fmt::join(lost, ", "), 5 * kHeartbeat.count());
      if (!behind.empty())
        return fmt::format(
            "rank {} is alive but did not join within the collective timeout of "
            "{:g} s (hung)",
            fmt::join(behind, ", "), options.collective_timeout_s);
      return "every rank is alive; the peer connection failed";
    } catch (const std::exception&) {
      return env.agent_store
                 ? fmt::format("lost the launcher (the store at {}:{} is gone)", env.master_addr,
                               env.port)
                 : fmt::format("lost rank 0 (it hosted the store at {}:{}, which is gone)",
                               env.master_addr, env.port);
    }
  }

  // Runs f, one collective (or, with launch = false, the wait for one launched earlier); any
  // failure becomes one line naming the lost or hung rank.
  template <class F>
  void collective(const std::string& what, F&& f, bool launch = true) {
    CEMFRAC_CHECK(!broken, "rank {}: the process group failed earlier", env.rank);
    if (launch) ++seq;
    try {
      if (launch) store->set(key("seq", env.rank), to_bytes(std::to_string(seq)));
      f();
    } catch (const std::exception& e) {
      broken = true;
      const std::string why = diagnose();
      fail("rank {} of {}: {} failed: {} [{}]", env.rank, env.world_size, what, why,
           first_line(e.what()));
    }
  }
};

DistContext::DistContext(const DistEnv& env, const DistOptions& options,
                         const torch::Device& device)
    : env_(env), options_(options), grouped_(env.world_size > 1 || options.group_for_one_rank) {
  if (!active()) return;
  CEMFRAC_CHECK(!device.is_cuda() || compat::kHaveNccl,
                "rank {} of {}: data-parallel training on {} needs NCCL, and this LibTorch ({}) "
                "was built without it",
                env.rank, env.world_size, device.str(), compat::torch_version());
  CEMFRAC_CHECK(device.is_cpu() || device.is_cuda(),
                "rank {} of {}: data-parallel training runs on cpu or cuda, not {}", env.rank,
                env.world_size, device.str());
  BlockStopSignals block;
  impl_ = std::make_unique<Impl>();
  impl_->env = env;
  impl_->options = options;
  const bool server = env.rank == 0 && !env.agent_store;
  try {
    compat::QuietTorchLogs quiet;
    impl_->store = connect_store(env, options.connect_timeout_s, server);
  } catch (const std::exception& e) {
    fail(
        "rank {} of {}: cannot {} the rendezvous store at {}:{} within {:g} s: {} (check "
        "MASTER_ADDR/MASTER_PORT{})",
        env.rank, env.world_size, server ? "host" : "reach", env.master_addr, env.port,
        options.connect_timeout_s, first_line(e.what()),
        env.agent_store ? " and that the launcher runs" : " and that rank 0 runs");
  }
  try {
    impl_->start_heartbeat();
    impl_->store->set(impl_->key("seq", env.rank), to_bytes("0"));
    // Every rank present (within the connect timeout) before the group's own rendezvous, which then
    // only needs the collective timeout.
    std::vector<std::string> joined;
    for (int64_t r = 0; r < env.world_size; ++r) joined.push_back(impl_->key("joined", r));
    impl_->store->set(joined[env.rank], to_bytes("1"));
    impl_->store->wait(joined, to_ms(options.connect_timeout_s));
    impl_->pg = compat::make_c10d_backend(
        impl_->store, static_cast<int>(env.rank), static_cast<int>(env.world_size),
        to_ms(options.collective_timeout_s), device, gloo_device(env));
    impl_->backend = device.is_cuda() ? "nccl" : "gloo";
    impl_->side =
        device.is_cuda()
            ? compat::make_c10d_backend(
                  c10::make_intrusive<c10d::PrefixStore>("side", impl_->store),
                  static_cast<int>(env.rank), static_cast<int>(env.world_size),
                  to_ms(options.collective_timeout_s), c10::Device(c10::kCPU), gloo_device(env))
            : impl_->pg;
  } catch (const std::exception& e) {
    impl_->broken = true;
    impl_->stop();
    fail("rank {} of {}: could not meet all {} ranks within {:g} s: {}", env.rank, env.world_size,
         env.world_size, options.connect_timeout_s, first_line(e.what()));
  }
}

DistContext::~DistContext() {
  if (!impl_) return;
  impl_->stop();
  if (impl_->broken) {
    // A failed Gloo group can block in its destructor on a peer that never answers: leave it.
    (void)impl_->pg.release();
    (void)impl_->side.release();
    (void)impl_->store.release();
  }
}

std::string DistContext::backend() const {
  return active() ? impl_->backend : "none";
}

std::string DistContext::describe() const {
  if (!active()) return "world 1 (one process, no process group)";
  return fmt::format(
      "world {}, backend {}, rank {} (local {} of {}), store {}:{} hosted by {}, timeouts: connect "
      "{:g} s, collective {:g} s",
      env_.world_size, backend(), env_.rank, env_.local_rank, env_.local_world_size,
      env_.master_addr, env_.port, env_.agent_store ? "the launcher" : "rank 0",
      options_.connect_timeout_s, options_.collective_timeout_s);
}

void DistContext::check_same(const std::string& what, const std::string& value) {
  if (!active()) return;
  Impl& m = *impl_;
  const std::string mine = impl_->key(("same/" + what).c_str(), env_.rank);
  std::vector<std::string> values(env_.world_size);
  m.collective("comparing " + what, [&] {
    m.store->set(mine, to_bytes(value));
    for (int64_t r = 0; r < env_.world_size; ++r)
      values[r] = from_bytes(m.store->get(impl_->key(("same/" + what).c_str(), r)));
  });
  for (int64_t r = 0; r < env_.world_size; ++r)
    CEMFRAC_CHECK(values[r] == values[0],
                  "rank {} of {}: rank {}'s {} ({}) differs from rank 0's ({}); start every rank "
                  "with the same config, data and cemfrac binary",
                  env_.rank, env_.world_size, r, what, values[r], values[0]);
}

void DistContext::broadcast(const std::vector<torch::Tensor>& tensors, int64_t root,
                            const std::string& what) {
  if (!active()) return;
  Impl& m = *impl_;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& bucket : buckets(tensors, options_.bucket_bytes)) {
    m.collective("broadcast of " + what, [&] {
      std::vector<torch::Tensor> flat{flatten(bucket)};
      c10d::BroadcastOptions o;
      o.rootRank = static_cast<int64_t>(root);
      m.pg->broadcast(flat, o)->wait();
      unflatten(flat[0], bucket);
    });
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.add_timing(s, s);
}

void DistContext::send_to_rank0(const std::vector<torch::Tensor>& tensors, int64_t from,
                                const std::string& what) {
  if (!active() || from == 0 || (env_.rank != 0 && env_.rank != from)) return;
  Impl& m = *impl_;
  for (const auto& bucket : buckets(tensors, options_.bucket_bytes)) {
    m.collective(fmt::format("sending {} from rank {} to rank 0", what, from), [&] {
      std::vector<torch::Tensor> flat{flatten(bucket)};
      if (env_.rank == from) {
        m.pg->send(flat, 0, 0)->wait();
      } else {
        m.pg->recv(flat, static_cast<int>(from), 0)->wait();
        unflatten(flat[0], bucket);
      }
    });
  }
}

void DistContext::broadcast_from_rank0(const std::vector<torch::Tensor>& tensors,
                                       const std::string& what) {
  if (!active()) return;
  Impl& m = *impl_;
  broadcast(tensors, 0, what);
  m.step_timing = ReduceTiming{};  // start of the run, not a step
  // Equal bytes everywhere: min and max of the hash over ranks agree.
  const auto h = static_cast<int64_t>(bytes_hash(tensors));
  torch::Tensor lo = torch::full({1}, h, torch::kInt64), hi = lo.clone();
  m.collective("check of " + what, [&] {
    std::vector<torch::Tensor> a{lo}, b{hi};
    c10d::AllreduceOptions omin, omax;
    omin.reduceOp = c10d::ReduceOp::MIN;
    omax.reduceOp = c10d::ReduceOp::MAX;
    m.side->allreduce(a, omin)->wait();
    m.side->allreduce(b, omax)->wait();
  });
  CEMFRAC_CHECK(lo.item<int64_t>() == hi.item<int64_t>(),
                "rank {} of {}: the {} differ across ranks after the broadcast from rank 0",
                env_.rank, env_.world_size, what);
}

void DistContext::allreduce_mean(const std::vector<torch::Tensor>& tensors,
                                 const std::string& what) {
  if (!active()) return;
  Impl& m = *impl_;
  torch::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  const double world = static_cast<double>(env_.world_size);
  for (const auto& bucket : buckets(tensors, options_.bucket_bytes)) {
    m.collective("all-reduce of " + what, [&] {
      if (bucket.size() == 1 && bucket.front().is_contiguous()) {
        std::vector<torch::Tensor> one{bucket.front()};
        m.pg->allreduce(one)->wait();
        one.front().div_(world);
        return;
      }
      std::vector<torch::Tensor> parts;
      for (const auto& t : bucket) parts.push_back(t.reshape({-1}));
      std::vector<torch::Tensor> flat{torch::cat(parts)};
      m.pg->allreduce(flat)->wait();
      flat[0].div_(world);
      int64_t offset = 0;
      for (const auto& t : bucket) {
        t.copy_(flat[0].narrow(0, offset, t.numel()).view_as(t));
        offset += t.numel();
      }
    });
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.add_timing(s, s);
}

std::vector<double> DistContext::allreduce_sum(const std::vector<double>& values,
                                               const std::string& what, bool end_of_step) {
  if (!active()) return values;
  Impl& m = *impl_;
  torch::Tensor t = torch::tensor(values, torch::kFloat64);
  const auto start = std::chrono::steady_clock::now();
  m.collective("all-reduce of " + what, [&] {
    std::vector<torch::Tensor> v{t};
    m.side->allreduce(v)->wait();
  });
  if (end_of_step) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    m.add_timing(s, s);
    if (m.observer != nullptr) m.observer->on_step_reduced(m.step_timing);
    m.step_timing = ReduceTiming{};
  }
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

void DistContext::set_observer(ReduceObserver* observer) {
  if (active()) impl_->observer = observer;
}

void DistContext::attach_gradients(const std::vector<torch::Tensor>& params, bool overlap,
                                   const std::vector<int64_t>& owners) {
  CEMFRAC_CHECK(owners.empty() || owners.size() == params.size(),
                "attach_gradients: {} owners for {} parameters", owners.size(), params.size());
  attached_ = params;
  owners_ = owners;
  reducer_ = overlap ? std::make_unique<GradientReducer>(*this, params, owners) : nullptr;
}

void DistContext::before_last_backward(int64_t /*step*/) {
  if (reducer_) reducer_->arm();
}

void DistContext::reduce_gradients() {
  if (!active()) return;
  if (reducer_) {
    reducer_->finish();
    return;
  }
  if (owners_.empty()) {
    std::vector<torch::Tensor> grads;
    for (const torch::Tensor& p : attached_)
      if (p.requires_grad() && p.grad().defined()) grads.push_back(p.grad());
    allreduce_mean(grads, "gradients");
    return;
  }
  // Sharded: each owner's gradients reduced to it, divided there; the other ranks drop theirs.
  Impl& m = *impl_;
  torch::NoGradGuard no_grad;
  const auto start = std::chrono::steady_clock::now();
  const double world = static_cast<double>(env_.world_size);
  for (int64_t owner = 0; owner < env_.world_size; ++owner) {
    std::vector<torch::Tensor> params;
    for (size_t i = 0; i < attached_.size(); ++i) {
      const torch::Tensor& p = attached_[i];
      if (owners_[i] == owner && p.requires_grad() && p.grad().defined()) params.push_back(p);
    }
    std::vector<torch::Tensor> grads;
    for (const auto& p : params) grads.push_back(p.grad());
    for (const auto& bucket : buckets(grads, options_.bucket_bytes)) {
      m.collective("all-reduce of gradients", [&] {
        std::vector<torch::Tensor> flat{flatten(bucket)};
        c10d::ReduceOptions o;
        o.rootRank = owner;
        m.pg->reduce(flat, o)->wait();
        if (env_.rank == owner) unflatten(flat[0].div_(world), bucket);
      });
    }
    if (env_.rank != owner)
      for (const auto& p : params) p.mutable_grad().reset();
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.add_timing(s, s);
}

void DistContext::barrier(const std::string& what) {
  if (!active()) return;
  Impl& m = *impl_;
  m.collective(what, [&] { m.side->barrier()->wait(); });
}

void DistContext::finish() {
  if (!active() || impl_->broken) return;
  barrier("final barrier");
  impl_->stop();
}

struct GradientReducer::State : std::enable_shared_from_this<GradientReducer::State> {
  using Clock = std::chrono::steady_clock;
  struct Launched {
    std::vector<torch::Tensor> grads;  // where the mean goes (empty: reduced to another rank)
    std::vector<torch::Tensor> flat;   // one tensor: the bucket's gradients, concatenated
    c10::intrusive_ptr<c10d::Work> work;
  };

  DistContext* dist = nullptr;
  std::vector<torch::Tensor> params;  // reverse table order
  std::vector<std::vector<size_t>> bucket_params;
  std::vector<int64_t> bucket_owner;  // -1: all-reduced; else reduced to that rank only
  std::vector<size_t> bucket_of;
  // The accumulators carry the hooks; holding them keeps them (autograd itself holds them weakly
  // between graphs and would make new ones without our hooks).
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<uintptr_t> hook_keys;

  // One step's state (arm .. finish).
  bool armed = false;
  std::vector<char> ready;
  std::vector<int64_t> waiting;  // per bucket: parameters not ready yet
  size_t next = 0;               // next bucket to launch
  bool launched_any = false;
  std::vector<Launched> launched;
  std::exception_ptr error;  // a launch that failed inside a hook, rethrown by finish()
  Clock::time_point first_launch;
  // Completion time of the last finished bucket (ns since the clock's epoch), set on Gloo's
  // threads.
  std::shared_ptr<std::atomic<int64_t>> last_done = std::make_shared<std::atomic<int64_t>>(0);

  void hook(size_t i);
  void on_ready(size_t i) {
    if (!armed || ready[i] || error) return;
    ready[i] = 1;
    if (--waiting[bucket_of[i]] > 0) return;
    try {
      while (next < bucket_params.size() && waiting[next] <= 0) launch(next++);
    } catch (...) {
      error = std::current_exception();
    }
  }

  void launch(size_t b) {
    std::vector<torch::Tensor> grads;
    for (size_t i : bucket_params[b]) {
      const torch::Tensor& p = params[i];
      if (p.requires_grad() && p.grad().defined()) grads.push_back(p.grad());
    }
    if (grads.empty()) return;
    release_sent();
    if (!launched_any) {
      launched_any = true;
      first_launch = Clock::now();
    }
    DistContext::Impl& m = *dist->impl_;
    torch::NoGradGuard no_grad;
    Launched l;
    const int64_t owner = bucket_owner[b];
    std::vector<torch::Tensor> parts;
    for (const auto& g : grads) parts.push_back(g.reshape({-1}));
    l.flat = {torch::cat(parts)};
    if (owner < 0 || owner == dist->rank()) {
      l.grads = grads;
    } else {
      // Another rank's gradients: the flat copy is what is sent; the gradients go now.
      for (size_t i : bucket_params[b]) params[i].mutable_grad().reset();
    }
    m.collective("all-reduce of gradients", [&] {
      if (owner < 0) {
        l.work = m.pg->allreduce(l.flat);
      } else {
        c10d::ReduceOptions o;
        o.rootRank = owner;
        l.work = m.pg->reduce(l.flat, o);
      }
      l.work->getFuture()->addCallback([done = last_done](c10::ivalue::Future&) {
        const int64_t now = Clock::now().time_since_epoch().count();
        int64_t seen = done->load();
        while (seen < now && !done->compare_exchange_weak(seen, now)) {
        }
      });
    });
    launched.push_back(std::move(l));
  }

  // Frees the send buffers of buckets reduced to another rank once their reduction has completed
  // (during backward, so that sharded gradients lower the peak, not only the end state).
  void release_sent() {
    for (Launched& l : launched) {
      if (!l.grads.empty() || !l.work || !l.work->isCompleted()) continue;
      dist->impl_->collective(
          "all-reduce of gradients", [&] { l.work->wait(); }, /*launch=*/false);
      l.work.reset();
      l.flat.clear();
    }
  }
};

namespace {

class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::weak_ptr<GradientReducer::State> state, size_t index)
      : state_(std::move(state)), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    if (auto s = state_.lock()) s->on_ready(index_);
    return outputs;
  }

 private:
  std::weak_ptr<GradientReducer::State> state_;
  size_t index_;
};

}  // namespace

// Installs the hook of parameter i once it requires grad (a frozen parameter has no accumulator).
void GradientReducer::State::hook(size_t i) {
  if (accumulators[i] || !params[i].requires_grad()) return;
  accumulators[i] = torch::autograd::impl::grad_accumulator(params[i]);
  if (!accumulators[i]) return;
  hook_keys[i] = accumulators[i]->add_post_hook(std::make_unique<ReadyHook>(weak_from_this(), i));
}

GradientReducer::GradientReducer(DistContext& dist, const std::vector<torch::Tensor>& params,
                                 const std::vector<int64_t>& owners)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.dist = &dist;
  if (!dist.active()) return;
  CEMFRAC_CHECK(owners.empty() || owners.size() == params.size(),
                "GradientReducer: {} owners for {} parameters", owners.size(), params.size());
  s.params.assign(params.rbegin(), params.rend());
  const std::vector<int64_t> owner_of = owners.empty()
                                            ? std::vector<int64_t>(params.size(), -1)
                                            : std::vector<int64_t>(owners.rbegin(), owners.rend());
  const int64_t cap = dist.options().bucket_bytes;
  int64_t size = 0, limit = std::min<int64_t>(cap, 1 << 20);
  for (size_t i = 0; i < s.params.size(); ++i) {
    const torch::Tensor& p = s.params[i];
    const int64_t b = p.numel() * static_cast<int64_t>(p.element_size());
    if (s.bucket_params.empty() || size + b > limit ||
        s.params[s.bucket_params.back().front()].scalar_type() != p.scalar_type() ||
        s.params[s.bucket_params.back().front()].device() != p.device() ||
        s.bucket_owner.back() != owner_of[i]) {
      if (!s.bucket_params.empty()) limit = cap;
      s.bucket_params.emplace_back();
      s.bucket_owner.push_back(owner_of[i]);
      size = 0;
    }
    s.bucket_params.back().push_back(i);
    s.bucket_of.push_back(s.bucket_params.size() - 1);
    size += b;
  }
  s.accumulators.resize(s.params.size());
  s.hook_keys.resize(s.params.size(), 0);
}

GradientReducer::~GradientReducer() {
  State& s = *state_;
  for (size_t i = 0; i < s.accumulators.size(); ++i)
    if (s.accumulators[i]) s.accumulators[i]->del_post_hook(s.hook_keys[i]);
}

int64_t GradientReducer::buckets() const {
  return static_cast<int64_t>(state_->bucket_params.size());
}

void GradientReducer::arm() {
  State& s = *state_;
  if (!s.dist->active()) return;
  CEMFRAC_CHECK(!s.armed, "GradientReducer::arm: the last step was not finished");
  s.armed = true;
  s.ready.assign(s.params.size(), 0);
  s.waiting.assign(s.bucket_params.size(), 0);
  for (size_t i = 0; i < s.params.size(); ++i) {
    s.hook(i);
    if (s.params[i].requires_grad()) ++s.waiting[s.bucket_of[i]];
  }
  s.next = 0;
  s.launched_any = false;
  s.launched.clear();
  s.error = nullptr;
  s.last_done->store(0);
}

void GradientReducer::finish() {
  State& s = *state_;
  if (!s.dist->active()) return;
  CEMFRAC_CHECK(s.armed, "GradientReducer::finish without arm");
  s.armed = false;
  using Clock = State::Clock;
  const auto start = Clock::now();
  DistContext::Impl& m = *s.dist->impl_;
  if (s.error) std::rethrow_exception(s.error);
  // What backward did not complete (no gradient, or no hook), in bucket order.
  while (s.next < s.bucket_params.size()) s.launch(s.next++);
  torch::NoGradGuard no_grad;
  const double world = static_cast<double>(s.dist->world_size());
  for (State::Launched& l : s.launched) {
    if (!l.work) continue;  // released during backward (reduced to another rank)
    m.collective(
        "all-reduce of gradients", [&] { l.work->wait(); }, /*launch=*/false);
    if (l.grads.empty()) continue;  // reduced to another rank
    torch::Tensor& flat = l.flat.front();
    flat.div_(world);
    int64_t offset = 0;
    for (const torch::Tensor& g : l.grads) {
      g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
      offset += g.numel();
    }
  }
  // Exposed: all of finish(). Overlapped: from the first launch (during backward) until backward
  // ended or the last bucket completed, whichever came first.
  const double exposed = std::chrono::duration<double>(Clock::now() - start).count();
  double overlapped = 0;
  if (!s.launched.empty() && s.first_launch < start) {
    const int64_t done = s.last_done->load();
    const auto until = done > 0 ? std::min(start, Clock::time_point(Clock::duration(done))) : start;
    overlapped = std::max(0.0, std::chrono::duration<double>(until - s.first_launch).count());
  }
  m.add_timing(exposed + overlapped, exposed);
  s.launched.clear();
}

struct StoreServer::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

StoreServer::StoreServer(const std::string& addr, int port, double timeout_s)
    : impl_(std::make_unique<Impl>()) {
  c10d::TCPStoreOptions o = compat::tcp_store_options();
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = to_ms(timeout_s);
  BlockStopSignals block;  // the store's daemon thread must not take the launcher's SIGINT
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(addr, o);
  } catch (const std::exception& e) {
    fail("cannot host the rendezvous store on {}:{}: {}", addr, port, first_line(e.what()));
  }
}

StoreServer::~StoreServer() = default;

int StoreServer::port() const {
  return impl_->store->getPort();
}

}  // namespace cemfrac
