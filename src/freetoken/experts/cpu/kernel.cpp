// CPU expert kernel: a persistent pool of pinned, sleeping worker threads that computes
//   out[t] = sum over routes s with tok[s] == t of  w[s] * down[row[s]] @ act(gate_up[row[s]] @ x[t])
// in two memory-bound phases (every thread streams disjoint weight bytes):
//   phase 1: h = act(gate_up . x) for all routes, split over (distinct row, block of h indices);
//   barrier;
//   phase 2: out rows split over threads, each adding its rows over all routes in a fixed order.
// The ISA-specific phases live in isa_*.cpp (one TU per -m flag set), picked at run time.
// C API at the bottom (ctypes); no torch headers.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#ifdef __linux__
#include <sched.h>
#endif

#include "kernel_api.h"

extern "C" struct FtMoeArgs {
  const float* x;  // [T, D] fp32
  int64_t T, D, I;
  const int32_t* tok;  // [R]
  const int64_t* row;  // [R] pool rows
  const float* w;      // [R]
  int64_t R;
  const void* gate_up;  // [N, 2I, D]
  const void* down;     // [N, D, I]
  int64_t N;
  int32_t fmt, act;
  float* out;            // [T, D] fp32
  uint32_t* done_flag;   // optional: set to done_value (release) when the batch is finished
  uint32_t done_value;
};

namespace ft {
namespace {

constexpr int64_t kHBlock = 16;  // h indices per phase-1 unit (32 weight rows)
constexpr int64_t kDBlock = 16;  // output rows per phase-2 block

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

void split_bf16(const float* src, int64_t n, uint16_t* hi, uint16_t* lo) {
  for (int64_t i = 0; i < n; ++i) {
    hi[i] = f32_to_bf16(src[i]);
    lo[i] = f32_to_bf16(src[i] - bf16_to_f32(hi[i]));
  }
}

class Pool {
 public:
  Pool(int n, const int* cpus, int isa) : n_(n), isa_(isa), ops_(ops_for(isa)), partial_(8 * n, 0) {
    for (int k = 0; k < n; ++k) threads_.emplace_back([this, k, cpu = cpus ? cpus[k] : -1] { worker(k, cpu); });
  }

  ~Pool() {
    wait();
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_start_.notify_all();
    for (auto& t : threads_) t.join();
  }

  int threads() const { return n_; }
  int isa() const { return isa_; }

  bool busy() {
    std::lock_guard<std::mutex> lk(mu_);
    return busy_;
  }

  int submit_moe(const FtMoeArgs& a) {
    if (busy()) return -1;
    if (a.T < 0 || a.D <= 0 || a.I <= 0 || a.R < 0 || a.N < 0 || (a.T > 0 && (!a.x || !a.out))) return -2;
    for (int64_t s = 0; s < a.R; ++s) {
      if (a.tok[s] < 0 || a.tok[s] >= a.T) return -3;
      if (a.row[s] < 0 || a.row[s] >= a.N) return -4;
    }
    if ((a.fmt != FMT_F32 && a.fmt != FMT_BF16) || (a.act != ACT_SILU && a.act != ACT_GPTOSS)) return -5;
    build_plan(a);
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
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [this] { return !busy_; });
  }

 private:
  enum Kind { kMoe, kRead };

  void build_plan(const FtMoeArgs& a) {
    const int64_t R = a.R;
    order_.resize(R);
    std::iota(order_.begin(), order_.end(), int64_t{0});
    std::stable_sort(order_.begin(), order_.end(), [&a](int64_t i, int64_t j) { return a.row[i] < a.row[j]; });
    s_tok_.resize(R);
    s_w_.resize(R);
    group_row_.clear();
    group_start_.clear();
    for (int64_t s = 0; s < R; ++s) {
      const int64_t r = order_[s];
      s_tok_[s] = a.tok[r];
      s_w_[s] = a.w[r];
      if (s == 0 || a.row[r] != group_row_.back()) group_row_.push_back(a.row[r]), group_start_.push_back(s);
    }
    group_start_.push_back(R);
    h_.resize(R * a.I);
    Plan& p = plan_;
    p = Plan{};
    p.x = a.x, p.T = a.T, p.D = a.D, p.I = a.I;
    p.gate_up = a.gate_up, p.down = a.down, p.fmt = a.fmt, p.act = a.act, p.out = a.out;
    p.R = R, p.G = static_cast<int64_t>(group_row_.size());
    p.group_row = group_row_.data(), p.group_start = group_start_.data();
    p.s_tok = s_tok_.data(), p.s_w = s_w_.data(), p.h = h_.data();
    split_ = ops_.split_bf16 && a.fmt == FMT_BF16 && R > 0;
    if (split_) {
      x_hi_.resize(a.T * a.D), x_lo_.resize(a.T * a.D), h_hi_.resize(R * a.I), h_lo_.resize(R * a.I);
      p.x_hi = x_hi_.data(), p.x_lo = x_lo_.data(), p.h_hi = h_hi_.data(), p.h_lo = h_lo_.data();
    }
    p.hblock = kHBlock;
    p.units1 = p.G * ((a.I + kHBlock - 1) / kHBlock);
    p.dblock = kDBlock;
    p.blocks2 = (a.D + kDBlock - 1) / kDBlock;
  }

  void start(Kind kind) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      kind_ = kind;
      busy_ = true;
      remaining_ = n_;
      ++gen_;
    }
    cv_start_.notify_all();
  }

  // Sleeping barrier among the workers (phases last milliseconds; never spin on few cores).
  void barrier() {
    std::unique_lock<std::mutex> lk(bmu_);
    const uint64_t g = bgen_;
    if (++bcount_ == n_) {
      bcount_ = 0;
      ++bgen_;
      bcv_.notify_all();
    } else {
      bcv_.wait(lk, [this, g] { return bgen_ != g; });
    }
  }

  static int64_t lo(int64_t total, int k, int n) { return total * k / n; }

  void run_moe(int k) {
    const Plan& p = plan_;
    if (split_) {  // phase 0: bf16 hi/lo split of x, split over tokens
      const int64_t t0 = lo(p.T, k, n_), t1 = lo(p.T, k + 1, n_);
      split_bf16(p.x + t0 * p.D, (t1 - t0) * p.D, x_hi_.data() + t0 * p.D, x_lo_.data() + t0 * p.D);
      barrier();
    }
    ops_.phase1(p, lo(p.units1, k, n_), lo(p.units1, k + 1, n_));
    barrier();
    ops_.phase2(p, lo(p.blocks2, k, n_), lo(p.blocks2, k + 1, n_));
  }

  void run_read(int k) {
    const int64_t w0 = lo(rwords_, k, n_), w1 = lo(rwords_, k + 1, n_);
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    int64_t i = w0;
    for (; i + 4 <= w1; i += 4) a0 += rp_[i], a1 += rp_[i + 1], a2 += rp_[i + 2], a3 += rp_[i + 3];
    for (; i < w1; ++i) a0 += rp_[i];
    partial_[8 * k] = a0 + a1 + a2 + a3;
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
      Kind kind;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_start_.wait(lk, [this, seen] { return stop_ || gen_ != seen; });
        if (stop_) return;
        seen = gen_;
        kind = kind_;
      }
      if (kind == kMoe) run_moe(k);
      else run_read(k);
      std::lock_guard<std::mutex> lk(mu_);
      if (--remaining_ == 0) {
        busy_ = false;
        if (done_flag_) __atomic_store_n(done_flag_, done_value_, __ATOMIC_RELEASE);
        cv_done_.notify_all();
      }
    }
  }

  const int n_;
  const int isa_;
  const IsaOps ops_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  uint64_t gen_ = 0;
  bool stop_ = false, busy_ = false;
  int remaining_ = 0;
  Kind kind_ = kMoe;
  std::mutex bmu_;
  std::condition_variable bcv_;
  int bcount_ = 0;
  uint64_t bgen_ = 0;
  // current batch (owned here so repeated calls reuse the allocations)
  Plan plan_{};
  bool split_ = false;
  std::vector<int64_t> order_, group_row_, group_start_;
  std::vector<int32_t> s_tok_;
  std::vector<float> s_w_, h_;
  std::vector<uint16_t> x_hi_, x_lo_, h_hi_, h_lo_;
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

// n workers; cpus: null or n CPU ids to pin worker k to cpus[k]. Null when the ISA is unsupported.
void* ft_pool_create(int n, const int* cpus, int isa) {
  if (n < 1 || !ft::isa_supported(isa)) return nullptr;
  return new ft::Pool(n, cpus, isa);
}

void ft_pool_destroy(void* pool) { delete static_cast<ft::Pool*>(pool); }
int ft_pool_threads(void* pool) { return static_cast<ft::Pool*>(pool)->threads(); }
int ft_pool_isa(void* pool) { return static_cast<ft::Pool*>(pool)->isa(); }
int ft_pool_busy(void* pool) { return static_cast<ft::Pool*>(pool)->busy() ? 1 : 0; }

// 0: started; -1 busy (wait first); -2 bad dims/pointers; -3 token out of range; -4 row out of range;
// -5 unknown format or activation.
int ft_moe_submit(void* pool, const FtMoeArgs* args) { return static_cast<ft::Pool*>(pool)->submit_moe(*args); }
void ft_wait(void* pool) { static_cast<ft::Pool*>(pool)->wait(); }

uint64_t ft_stream_read(void* pool, const void* p, int64_t bytes) {
  return static_cast<ft::Pool*>(pool)->stream_read(static_cast<const uint64_t*>(p), bytes / 8);
}

}  // extern "C"
