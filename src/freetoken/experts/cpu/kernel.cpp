// CPU expert kernel: a persistent pool of pinned, sleeping worker threads that computes
//   out[t] = sum over routes s with tok[s] == t of  w[s] * down[row[s]] @ act(gate_up[row[s]] @ x[t])
// in memory-bound phases where every thread streams disjoint weight bytes:
//   phase 1: h = act(gate_up . x) for all routes, units of (distinct row, block of h indices);
//   barrier;
//   phase 2: y = down . h for all routes, units of (distinct row, block of down rows);
//   barrier;
//   phase 3: out[t] = sum of w * y over t's routes in a fixed order (small, cache-resident).
// Units are handed out dynamically; a unit's result never depends on which thread computed it.
// The ISA-specific phases live in isa_*.cpp (one TU per -m flag set), picked at run time.
// C API at the bottom (ctypes); no torch headers.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <new>
#include <system_error>
#include <mutex>
#include <thread>
#include <vector>

#ifdef __linux__
#include <sched.h>
#endif

#include "kernel_api.h"
#include "plan.h"

namespace ft {
namespace {

bool isa_supported(int isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  switch (isa) {
    case ISA_GENERIC: return true;
#ifdef FT_HAVE_AVX2
    case ISA_AVX2: return avx2;
#endif
#ifdef FT_HAVE_AVX512
    case ISA_AVX512: return avx512;
#endif
#ifdef FT_HAVE_AVX512BF16
    case ISA_AVX512BF16: return avx512 && __builtin_cpu_supports("avx512bf16");
#endif
    default: return false;
  }
#else
  return isa == ISA_GENERIC;
#endif
}

IsaOps ops_for(int isa) {
  switch (isa) {
#ifdef FT_HAVE_AVX2
    case ISA_AVX2: return ops_avx2();
#endif
#ifdef FT_HAVE_AVX512
    case ISA_AVX512: return ops_avx512();
#endif
#ifdef FT_HAVE_AVX512BF16
    case ISA_AVX512BF16: return ops_avx512bf16();
#endif
    default: return ops_generic();
  }
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls `pred` for up to spin_ns (0: not at all); true when it became true meanwhile. Only used
// where the wait is expected to be short (between phases, between a decode step's layers) and
// only when the caller asked for it: idle workers always end up asleep on a condition variable.
template <class Pred>
bool spin_until(Pred pred, int64_t spin_ns) {
  if (spin_ns <= 0) return pred();
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t i = 1;; ++i) {
    if (pred()) return true;
    cpu_relax();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() - t0 > std::chrono::nanoseconds(spin_ns)) return pred();
  }
}

void split_bf16(const float* src, int64_t n, uint16_t* hi, uint16_t* lo) {
  for (int64_t i = 0; i < n; ++i) {
    hi[i] = f32_to_bf16(src[i]);
    lo[i] = f32_to_bf16(src[i] - bf16_to_f32(hi[i]));
  }
}

class Pool {
 public:
  Pool(int n, const int* cpus, int isa, int64_t spin_ns)
      : n_(n), isa_(isa), spin_ns_(spin_ns), ops_(ops_for(isa)), partial_(8 * n, 0) {
    for (int k = 0; k < n; ++k) threads_.emplace_back([this, k, cpu = cpus ? cpus[k] : -1] { worker(k, cpu); });
  }

  ~Pool() {
    wait();
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_.store(true, std::memory_order_release);
    }
    cv_start_.notify_all();
    for (auto& t : threads_) t.join();
  }

  int threads() const { return n_; }
  int isa() const { return isa_; }

  bool busy() const { return busy_.load(std::memory_order_acquire); }

  int submit_moe(const FtMoeArgs& a) {
    if (busy()) return -1;
    if (const int rc = plans_.build(a, ops_.split_bf16)) return rc;
    done_flag_ = a.done_flag;
    done_value_ = a.done_value;
    start(kMoe);
    return 0;
  }

  // Sums `words` uint64 words with all workers (streaming-read bandwidth probe); synchronous.
  uint64_t stream_read(const uint64_t* p, int64_t words) {
    wait();
    rp_ = p;
    rwords_ = words;
    done_flag_ = nullptr;
    start(kRead);
    wait();
    uint64_t s = 0;
    for (int k = 0; k < n_; ++k) s += partial_[8 * k];
    return s;
  }

  void wait() {
    if (spin_until([this] { return !busy(); }, spin_ns_)) return;
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [this] { return !busy(); });
  }

 private:
  enum Kind { kMoe, kRead };

  void start(Kind kind) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      kind_ = kind;
      reset_counters();
      remaining_.store(n_, std::memory_order_relaxed);
      busy_.store(true, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_start_.notify_all();
  }

  // Barrier among the workers: a short optional spin, then sleep. The last to arrive runs
  // on_last() before releasing the others.
  template <class F>
  void barrier(F on_last) {
    const uint64_t g = bgen_.load(std::memory_order_acquire);
    if (bcount_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      on_last();
      bcount_.store(0, std::memory_order_relaxed);
      {
        std::lock_guard<std::mutex> lk(bmu_);
        bgen_.fetch_add(1, std::memory_order_release);
      }
      bcv_.notify_all();
      return;
    }
    auto passed = [this, g] { return bgen_.load(std::memory_order_acquire) != g; };
    if (spin_until(passed, spin_ns_)) return;
    std::unique_lock<std::mutex> lk(bmu_);
    bcv_.wait(lk, passed);
  }
  void barrier() {
    barrier([] {});
  }

  static int64_t lo(int64_t total, int k, int n) { return total * k / n; }

  void run_moe(int k) {
    const std::vector<Plan>& chunks = plans_.chunks();
    if (plans_.split()) {  // phase 0: bf16 hi/lo split of x, split over tokens
      const Plan& p = chunks.front();
      const int64_t t0 = lo(p.T, k, n_), t1 = lo(p.T, k + 1, n_);
      split_bf16(p.x + t0 * p.D, (t1 - t0) * p.D, plans_.x_hi() + t0 * p.D, plans_.x_lo() + t0 * p.D);
      barrier();
    }
    // Units are handed out one at a time (stragglers, e.g. a core shared with the GPU driver
    // thread, do not hold the others up); a unit's result does not depend on who computes it.
    for (size_t c = 0; c < chunks.size(); ++c) {
      const Plan& p = chunks[c];
      for (int64_t u; (u = next_[0].fetch_add(1, std::memory_order_relaxed)) < p.units1;) ops_.phase1(p, u);
      barrier();
      for (int64_t u; (u = next_[1].fetch_add(1, std::memory_order_relaxed)) < p.units2;) ops_.phase2(p, u);
      barrier();
      for (int64_t u; (u = next_[2].fetch_add(1, std::memory_order_relaxed)) < p.units3;) ops_.phase3(p, u);
      if (c + 1 < chunks.size()) barrier([this] { reset_counters(); });  // h and y are reused
    }
  }

  void reset_counters() {
    for (auto& n : next_) n.store(0, std::memory_order_relaxed);
  }

  void run_read(int k) {
    const int64_t w0 = lo(rwords_, k, n_), w1 = lo(rwords_, k + 1, n_);
    partial_[8 * k] = ops_.stream_sum(rp_ + w0, w1 - w0);
  }

  void worker(int k, int cpu) {
#ifdef __linux__
    if (cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      sched_setaffinity(0, sizeof(set), &set);  // best effort: a failure leaves the thread unpinned
    }
#else
    (void)cpu;
#endif
    uint64_t seen = 0;
    for (;;) {
      auto ready = [this, &seen] {
        return stop_.load(std::memory_order_acquire) || gen_.load(std::memory_order_acquire) != seen;
      };
      if (!spin_until(ready, spin_ns_)) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_start_.wait(lk, ready);
      }
      if (stop_.load(std::memory_order_acquire)) return;
      seen = gen_.load(std::memory_order_acquire);
      if (kind_ == kMoe) run_moe(k);
      else run_read(k);
      if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {  // the last worker out
        // The done flag first: once busy_ drops, the caller may submit (and overwrite done_flag_).
        if (done_flag_) __atomic_store_n(done_flag_, done_value_, __ATOMIC_RELEASE);
        {
          std::lock_guard<std::mutex> lk(mu_);
          busy_.store(false, std::memory_order_release);
        }
        cv_done_.notify_all();
      }
    }
  }

  const int n_;
  const int isa_;
  const int64_t spin_ns_;
  const IsaOps ops_;
  std::vector<std::thread> threads_;
  std::mutex mu_;  // guards sleeping on cv_start_ / cv_done_ (the flags themselves are atomics)
  std::condition_variable cv_start_, cv_done_;
  std::atomic<uint64_t> gen_{0};  // job generation: workers run each one exactly once
  std::atomic<bool> stop_{false}, busy_{false};
  std::atomic<int> remaining_{0};  // workers still running the current job
  Kind kind_ = kMoe;
  std::atomic<int64_t> next_[3] = {};  // next unit of each phase to hand out
  std::mutex bmu_;
  std::condition_variable bcv_;
  std::atomic<int> bcount_{0};
  std::atomic<uint64_t> bgen_{0};
  PlanBuilder plans_;  // the current batch (kept: repeated calls reuse its allocations)
  uint32_t* done_flag_ = nullptr;
  uint32_t done_value_ = 0;
  const uint64_t* rp_ = nullptr;
  int64_t rwords_ = 0;
  std::vector<uint64_t> partial_;  // one slot per thread, 64 bytes apart
};

}  // namespace
}  // namespace ft

extern "C" {

int ft_isa_supported(int isa) { return ft::isa_supported(isa) ? 1 : 0; }

// Best ISA this CPU and this build support; force_avx2 caps it at AVX2 (FREETOKEN_FORCE_AVX2).
int ft_best_isa(int force_avx2) {
  const int top = force_avx2 ? ft::ISA_AVX2 : ft::ISA_COUNT - 1;
  for (int isa = top; isa > ft::ISA_GENERIC; --isa)
    if (ft::isa_supported(isa)) return isa;
  return ft::ISA_GENERIC;
}

// n workers; cpus: null or n CPU ids to pin worker k to cpus[k]; spin_us: how long a worker polls
// for the next job / barrier before sleeping (0: sleep at once). Null when the ISA is unsupported.
void* ft_pool_create(int n, const int* cpus, int isa, int spin_us) {
  if (n < 1 || !ft::isa_supported(isa)) return nullptr;
  try {
    return new ft::Pool(n, cpus, isa, int64_t{spin_us} * 1000);
  } catch (const std::exception&) {  // no exception may cross the C boundary
    return nullptr;
  }
}

void ft_pool_destroy(void* pool) { delete static_cast<ft::Pool*>(pool); }
int ft_pool_threads(void* pool) { return static_cast<ft::Pool*>(pool)->threads(); }
int ft_pool_isa(void* pool) { return static_cast<ft::Pool*>(pool)->isa(); }
int ft_pool_busy(void* pool) { return static_cast<ft::Pool*>(pool)->busy() ? 1 : 0; }

// 0: started; -1 busy (wait first); -2 bad dims/pointers; -3 token out of range; -4 row out of range;
// -5 unknown format or activation; -6 out of memory for the plan's scratch.
int ft_moe_submit(void* pool, const FtMoeArgs* args) {
  try {
    return static_cast<ft::Pool*>(pool)->submit_moe(*args);
  } catch (const std::bad_alloc&) {
    return -6;
  }
}
void ft_wait(void* pool) { static_cast<ft::Pool*>(pool)->wait(); }

uint64_t ft_stream_read(void* pool, const void* p, int64_t bytes) {
  return static_cast<ft::Pool*>(pool)->stream_read(static_cast<const uint64_t*>(p), bytes / 8);
}

}  // extern "C"
