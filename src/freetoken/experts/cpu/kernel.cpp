// CPU expert kernel: a persistent pool of pinned, sleeping worker threads that computes
//   out[t] = sum over routes s with tok[s] == t of  w[s] * down[row[s]] @ act(gate_up[row[s]] @ x[t])
// in memory-bound steps where every thread streams disjoint weight bytes:
//   phase 1: h = act(gate_up . x) for all routes, units of (distinct row, block of h indices);
//   barrier;
//   phase 2: y = down . h for all routes, units of (distinct row, block of down rows);
//   barrier;
//   phase 3: out[t] = sum of w * y over t's routes in a fixed order (small, cache-resident).
// Units are handed out dynamically (workers.h); a unit's result never depends on which thread computed
// it. The ISA-specific phases live in isa_*.cpp (one TU per -m flag set), picked at run time.
// Plans (routes grouped by expert, chunked by tokens) come from plan.h. C API at the bottom
// (ctypes); no torch headers.
#include <algorithm>
#include <exception>
#include <new>
#include <vector>

#include "feeder.h"
#include "kernel_api.h"
#include "plan.h"
#include "workers.h"
#include "relax.h"

namespace ft {
namespace {

bool isa_supported(int isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  switch (isa) {
    case ISA_GENERIC: return true;
#ifdef FT_HAVE_AVX2
    case ISA_AVX2: return avx2;
#endif
#ifdef FT_HAVE_AVX2VNNI
    case ISA_AVX2VNNI: return avx2 && __builtin_cpu_supports("avxvnni");
#endif
#ifdef FT_HAVE_AVX512
    case ISA_AVX512: return avx512;
#endif
#ifdef FT_HAVE_AVX512VBMI
    case ISA_AVX512VBMI: return avx512 && __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vnni");
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
#ifdef FT_HAVE_AVX2VNNI
    case ISA_AVX2VNNI: return ops_avx2vnni();
#endif
#ifdef FT_HAVE_AVX512
    case ISA_AVX512: return ops_avx512();
#endif
#ifdef FT_HAVE_AVX512VBMI
    case ISA_AVX512VBMI: return ops_avx512vbmi();
#endif
#ifdef FT_HAVE_AVX512BF16
    case ISA_AVX512BF16: return ops_avx512bf16();
#endif
    default: return ops_generic();
  }
}

constexpr int64_t kSplitTokens = 8;  // tokens per unit of the bf16 hi/lo split of x

// `rows` rows of K values; FP4 banks read the halves in fp4_dp_pos order.
void split_bf16(const float* src, int64_t rows, int64_t K, bool fp4, uint16_t* hi, uint16_t* lo) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < K; ++i) {
      const float v = src[r * K + i];
      const int64_t j = r * K + (fp4 ? fp4_dp_pos(i, K) : i);
      hi[j] = f32_to_bf16(v);
      lo[j] = f32_to_bf16(v - bf16_to_f32(hi[j]));
    }
  }
}

// One batch of routes: step 0 writes x's other operand form (IsaOps::operands: bf16 hi/lo or int16 blocks), then
// three steps (phases 1, 2, 3) per token chunk.
class MoeJob final : public Job {
 public:
  MoeJob(const IsaOps& ops, PlanBuilder& plans) : ops_(ops), plans_(plans) {}
  int64_t steps() const override { return 1 + 3 * static_cast<int64_t>(plans_.chunks().size()); }
  int64_t units(int64_t s) const override {
    if (s == 0) return plans_.split() != OPERANDS_F32 ? (plans_.chunks().front().T + kSplitTokens - 1) / kSplitTokens : 0;
    const Plan& p = plans_.chunks()[(s - 1) / 3];
    const int64_t phase = (s - 1) % 3;
    return phase == 0 ? p.units1 : phase == 1 ? p.units2 : p.units3;
  }
  void run(int64_t s, int64_t u) override {
    if (s == 0) {
      const Plan& p = plans_.chunks().front();
      const int64_t t0 = u * kSplitTokens, t1 = std::min(p.T, t0 + kSplitTokens);
      if (plans_.split() == OPERANDS_Q16I_FP4) {
        for (int64_t t = t0; t < t1; ++t)
          quantize_q16i(p.x + t * p.D, 0, p.D, p.D, plans_.x_q() + t * p.D, plans_.x_qs() + t * (p.D / 32));
      } else {
        split_bf16(p.x + t0 * p.D, t1 - t0, p.D, fp4_format(p.fmt), plans_.x_hi() + t0 * p.D, plans_.x_lo() + t0 * p.D);
      }
      return;
    }
    const Plan& p = plans_.chunks()[(s - 1) / 3];
    switch ((s - 1) % 3) {
      case 0: return ops_.phase1(p, u);
      case 1: return ops_.phase2(p, u);
      default: return ops_.phase3(p, u);
    }
  }

 private:
  const IsaOps& ops_;
  PlanBuilder& plans_;
};

// Streaming-read probe: a parallel sum over uint64 words in contiguous slices, one per unit.
class ReadJob final : public Job {
 public:
  void reset(const uint64_t* p, int64_t words, int64_t slices) {
    p_ = p, words_ = words, partial_.assign(slices, 0);
  }
  int64_t steps() const override { return 1; }
  int64_t units(int64_t) const override { return static_cast<int64_t>(partial_.size()); }
  void run(int64_t, int64_t u) override {
    const int64_t n = units(0), w0 = words_ * u / n, w1 = words_ * (u + 1) / n;
    partial_[u] = stream_sum_(p_ + w0, w1 - w0);
  }
  uint64_t total() const {
    uint64_t s = 0;
    for (uint64_t v : partial_) s += v;
    return s;
  }
  uint64_t (*stream_sum_)(const uint64_t*, int64_t) = nullptr;

 private:
  const uint64_t* p_ = nullptr;
  int64_t words_ = 0;
  std::vector<uint64_t> partial_;
};

// What the C API hands out: the pool, the ISA's phases, and the current job's state.
class Kernel {
 public:
  Kernel(int n, const int* cpus, int isa, int64_t spin_ns)
      : ops_(ops_for(isa)),
        moe_(ops_, plans_),
        pool_(n, cpus, spin_ns, kHotSpinNs),
        feeder_([this](const FtMoeArgs& a) { return run_now(a); }, spin_ns, &pool_.hot(), &pool_) {
    read_.stream_sum_ = ops_.stream_sum;
  }

  int threads() const { return pool_.threads(); }
  // Batch-1 weight rows streamed at once per thread (1, 2, 4) for the batches built from now on.
  void set_rows(int64_t rows, int64_t rows_fp4) { plans_.set_rows(rows, rows_fp4); }
  bool busy() const { return pool_.busy(); }

  int submit_moe(const FtMoeArgs& a) {
    if (busy() || feeder_.pending()) return -1;
    pool_.quiesce();  // late workers of the previous batch may still read its plans
    if (const int rc = plans_.build(a, ops_.operands)) return rc;
    pool_.start(&moe_);
    return 0;
  }

  void wait(bool help) { pool_.wait(help); }

  // The whole batch on the calling thread, no worker woken: for batches so small that waking a worker
  // (and, on a loaded machine, waiting for it to be scheduled at each barrier) costs more than it computes.
  int run_moe_inline(const FtMoeArgs& a) {
    if (busy() || feeder_.pending()) return -1;
    pool_.quiesce();
    if (const int rc = plans_.build(a, ops_.operands)) return rc;
    for (int64_t s = 0; s < moe_.steps(); ++s)
      for (int64_t u = 0, n = moe_.units(s); u < n; ++u) moe_.run(s, u);
    return 0;
  }

  Feeder& feeder() { return feeder_; }

  // Sums `words` uint64 words with the workers only (same threads as the kernel); synchronous.
  uint64_t stream_read(const uint64_t* p, int64_t words) {
    feeder_.drain();
    pool_.wait(true);
    pool_.quiesce();
    read_.reset(p, words, 4 * static_cast<int64_t>(threads()));
    pool_.start(&read_);
    pool_.wait(false);
    return read_.total();
  }

 private:
  const IsaOps ops_;
  PlanBuilder plans_;  // the current batch (kept: repeated calls reuse its allocations)
  MoeJob moe_;
  ReadJob read_;
  WorkerPool pool_;  // its threads start after, and stop before, everything they read
  Feeder feeder_;  // last: its thread runs batches on pool_

  // A queued batch, on the feeder thread: the whole batch, this thread helping.
  int run_now(const FtMoeArgs& a) {
    pool_.quiesce();
    if (const int rc = plans_.build(a, ops_.operands)) return rc;
    pool_.start(&moe_);
    pool_.wait(true);
    return 0;
  }
};

}  // namespace
}  // namespace ft

extern "C" {

int ft_isa_supported(int isa) { return ft::isa_supported(isa) ? 1 : 0; }

// Best ISA this CPU and this build support.
int ft_best_isa() {
  for (int isa = ft::ISA_COUNT - 1; isa > ft::ISA_GENERIC; --isa)
    if (ft::isa_supported(isa)) return isa;
  return ft::ISA_GENERIC;
}

// n workers; cpus: null or n CPU ids to pin worker k to cpus[k]; spin_us: how long a thread polls
// for work before sleeping (0: sleep at once). Null when the ISA is unsupported.
void* ft_pool_create(int n, const int* cpus, int isa, int spin_us) {
  if (n < 1 || !ft::isa_supported(isa)) return nullptr;
  try {
    return new ft::Kernel(n, cpus, isa, int64_t{spin_us} * 1000);
  } catch (const std::exception&) {  // no exception may cross the C boundary
    return nullptr;
  }
}

void ft_pool_destroy(void* k) { delete static_cast<ft::Kernel*>(k); }

// Batch-1 row blocking (1, 2 or 4 weight rows streamed at once per thread; the ISA may cap it) for FP4 banks and
// for the other formats; set while idle. -1: not one of those.
int ft_pool_set_rows(void* k, int64_t rows, int64_t rows_fp4) {
  for (const int64_t r : {rows, rows_fp4})
    if (r != 1 && r != 2 && r != 4) return -1;
  static_cast<ft::Kernel*>(k)->set_rows(rows, rows_fp4);
  return 0;
}


// 0: started; -1 busy (wait first); -2 bad dims/pointers; -3 token out of range; -4 row out of range;
// -5 unknown format or activation; -6 out of memory for the plan's scratch.
int ft_moe_submit(void* k, const FtMoeArgs* args) {
  try {
    return static_cast<ft::Kernel*>(k)->submit_moe(*args);
  } catch (const std::bad_alloc&) {
    return -6;
  }
}

// A batch computed on the calling thread alone; returns when done (codes of ft_moe_submit).
int ft_moe_run_inline(void* k, const FtMoeArgs* args) {
  try {
    return static_cast<ft::Kernel*>(k)->run_moe_inline(*args);
  } catch (const std::bad_alloc&) {
    return -6;
  }
}

// Queues a batch that starts once its ready flag is reached (see feeder.h); returns at once.
// 0 queued; -2 bad dimensions or null pointers. Direct submits return -1 while batches are queued.
int ft_moe_enqueue(void* k, const FtQueuedArgs* args) {
  try {
    return static_cast<ft::Kernel*>(k)->feeder().push(*args);
  } catch (const std::bad_alloc&) {
    return -6;
  }
}

// Queues n batches at once, batch i as *args[i] with tokens[i] rows (a replayed step's layers: one call per
// step). 0 queued; -2 (nothing queued) if any is bad; -6 out of memory.
int ft_moe_enqueue_many(void* k, const FtQueuedArgs* const* args, const int64_t* tokens, int64_t n) {
  try {
    return static_cast<ft::Kernel*>(k)->feeder().push_many(args, tokens, n);
  } catch (const std::bad_alloc&) {
    return -6;
  }
}

// Blocks until every queued batch is done. ft_queue_pending: queued + running batches.
void ft_queue_drain(void* k) { static_cast<ft::Kernel*>(k)->feeder().drain(); }
int64_t ft_queue_pending(void* k) { return static_cast<ft::Kernel*>(k)->feeder().pending(); }
// The first error a queued batch met since the last call (0: none; codes of ft_moe_submit).
int ft_queue_error(void* k) { return static_cast<ft::Kernel*>(k)->feeder().take_error(); }

// Batch trace of the queued batches (Feeder::trace): cap records kept (0: off); take copies up to max
// records of ft_queue_trace_fields() int64 each into out, oldest first, and returns how many.
int ft_queue_trace_fields() { return ft::Feeder::kTraceFields; }
void ft_queue_trace(void* k, int64_t cap) { static_cast<ft::Kernel*>(k)->feeder().trace(cap); }
int64_t ft_queue_take_trace(void* k, int64_t* out, int64_t max) {
  return static_cast<ft::Kernel*>(k)->feeder().take_trace(out, max);
}

// Blocks until the submitted batch is done; help != 0: the calling thread takes units too.
void ft_wait(void* k, int help) { static_cast<ft::Kernel*>(k)->wait(help != 0); }

uint64_t ft_stream_read(void* k, const void* p, int64_t bytes) {
  return static_cast<ft::Kernel*>(k)->stream_read(static_cast<const uint64_t*>(p), bytes / 8);
}

}  // extern "C"
