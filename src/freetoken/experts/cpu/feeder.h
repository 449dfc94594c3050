// Stream-ordered CPU branch (DESIGN §7 step 3): batches queued ahead of time by the host, each started
// by the CPU only once a flag in pinned host memory reaches its value (the GPU stream writes it after
// copying the batch's inputs there), and announced done by a second flag the stream waits on. The host
// thread that queues never blocks: it can queue every MoE layer of a step before the GPU finishes the
// first. One feeder thread takes the batches in order and runs each on the worker pool, helping.
// Plain C++17, no ISA flags, no CUDA headers (the flags are plain memory here).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "job_queue.h"
#include "plan.h"
#include "workers.h"

extern "C" struct FtQueuedArgs {
  const float* x;  // [T, D] fp32
  int64_t T, D, I;
  // [T * k] route codes: c >= 0 does not run here (the GPU's slot); c < 0 runs here on pool row -1 - c
  const int64_t* codes;
  const float* w;        // [T * k] gate weights
  int64_t k;
  const void* gate_up;  // [N, 2I, D]
  const void* down;     // [N, D, I]
  int64_t N;
  int32_t fmt, act;
  float* out;                  // [T, D] fp32, fully written (zeros for tokens without routes here)
  const void* gate_up_scale;  // FMT_FP8_BLOCK / FP4 formats: scale banks (see FtMoeArgs); null otherwise
  const void* down_scale;
  const float* gate_up_bias;  // [N, 2I] fp32 or null (see FtMoeArgs)
  uint32_t* ready_flag;  // start once (int32)(*ready_flag - ready_value) >= 0 (mode 0)
  uint32_t ready_value;
  uint32_t* done_flag;  // set to done_value (release) when out and stats are written, also on error
  uint32_t done_value;
  // optional [4]: distinct pool rows, routes, ns from ready to done, error code (0 ok)
  int64_t* stats;
  // 0: sequence flags as above. 1: toggle flags, for replayed CUDA graphs whose written values are fixed:
  // start once *ready_flag == ready_value, then reset *ready_flag to 0 (the waiting side resets done).
  int32_t mode;
};

namespace ft {

class Feeder {
 public:
  // run: computes one batch to completion (0 or an ft_moe_submit error code); spin_ns: how long the
  // feeder polls a ready flag before it starts sleeping in short naps (0: naps at once); hot: counts
  // the batches queued and running here too (the worker pool spins longer while it is > 0).
  using RunFn = std::function<int(const FtMoeArgs&)>;
  // pool (optional): the pool run uses, whose step times the batch trace records.
  Feeder(RunFn run, int64_t spin_ns, std::atomic<int64_t>* hot = nullptr, const WorkerPool* pool = nullptr);
  ~Feeder();  // abandons queued batches, setting their done flags, so no stream waits forever

  // 0 queued; -2 bad dimensions or null pointers (nothing queued).
  int push(const FtQueuedArgs& a);
  // Copies of n checked batches with tokens[i] rows each, queued in order at once; -2 (nothing queued) if any
  // is bad. Called from one thread at a time (the engine's).
  int push_many(const FtQueuedArgs* const* args, const int64_t* tokens, int64_t n);
  // Blocks until every queued batch is done (their ready flags must come).
  void drain();
  int64_t pending() const { return batches_.pending(); }
  // The first error a batch met (0: none), cleared by reading.
  int take_error() { return error_.exchange(0); }
  // Batch trace (diagnostics): with cap > 0 every batch run from now on appends kTraceFields values,
  // the last cap batches kept: steady-clock ns when the feeder began waiting for the ready flag, saw it,
  // the pool's step opening times (WorkerPool::kTracedSteps, 0: step without units) and finish, done; then
  // the distinct pool rows. cap 0 turns it off.
  static constexpr int kTraceFields = 5 + WorkerPool::kTracedSteps;
  void trace(int64_t cap);
  // Copies up to max batches, oldest first, into out [max, kTraceFields] and forgets them; the count.
  int64_t take_trace(int64_t* out, int64_t max);

 private:
  void loop();
  void run_one(const FtQueuedArgs& a, int64_t t_wait);  // t_wait: when the feeder began waiting for it
  int compute(const FtQueuedArgs& a);  // decode the codes, run the batch; 0 or an error code
  void write_stats(const FtQueuedArgs& a, int64_t ns, int rc);  // a.stats[0..3] of the batch just run
  void record(int64_t t_wait, int64_t t_ready, int64_t t_done);  // one batch of the trace


  RunFn run_;
  const int64_t spin_ns_;
  std::vector<FtQueuedArgs> many_;  // push_many's copies (reused)
  JobQueue<FtQueuedArgs> batches_;  // queued + running; hot mirrors its count
  std::atomic<int> error_{0};
  std::vector<int32_t> tok_;  // the batch's routes, decoded from its codes (feeder thread only)
  std::vector<int64_t> row_;
  std::vector<float> w_;
  std::vector<int64_t> rows_;  // scratch: distinct rows for the stats
  int64_t distinct_ = 0;  // the last batch's (write_stats)
  const WorkerPool* pool_;
  std::mutex trace_mu_;
  std::vector<int64_t> trace_;  // ring of trace_cap_ records
  int64_t trace_cap_ = 0, trace_head_ = 0, trace_count_ = 0;
  std::thread thread_;  // last: starts after, and stops before, everything it reads
};

}  // namespace ft
