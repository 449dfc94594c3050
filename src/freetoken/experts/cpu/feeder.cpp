// See feeder.h.
#include "feeder.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>

#ifdef __linux__
#include <sys/prctl.h>
#endif

namespace ft {

Feeder::Feeder(RunFn run, int64_t spin_ns, std::atomic<int64_t>* hot, const WorkerPool* pool)
    : run_(std::move(run)), spin_ns_(spin_ns), batches_(hot), pool_(pool), thread_([this] { loop(); }) {}

void Feeder::trace(int64_t cap) {
  std::lock_guard<std::mutex> lk(trace_mu_);
  trace_cap_ = std::max<int64_t>(0, cap), trace_head_ = 0, trace_count_ = 0;
  trace_.assign(trace_cap_ * kTraceFields, 0);
}

int64_t Feeder::take_trace(int64_t* out, int64_t max) {
  std::lock_guard<std::mutex> lk(trace_mu_);
  const int64_t n = std::min(max, trace_count_);
  const int64_t first = (trace_head_ - trace_count_ + trace_cap_) % std::max<int64_t>(trace_cap_, 1);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t* r = trace_.data() + ((first + j) % trace_cap_) * kTraceFields;
    std::copy(r, r + kTraceFields, out + j * kTraceFields);
  }
  trace_count_ -= n;
  return n;
}

void Feeder::record(int64_t t_wait, int64_t t_ready, int64_t t_done) {
  std::lock_guard<std::mutex> lk(trace_mu_);
  if (trace_cap_ == 0) return;
  int64_t* r = trace_.data() + trace_head_ * kTraceFields;
  r[0] = t_wait, r[1] = t_ready;
  for (int s = 0; s < WorkerPool::kTracedSteps; ++s) r[2 + s] = pool_ ? pool_->step_open_ns()[s] : 0;
  r[2 + WorkerPool::kTracedSteps] = pool_ ? pool_->finish_ns() : 0;
  r[3 + WorkerPool::kTracedSteps] = t_done, r[kTraceFields - 1] = distinct_;
  trace_head_ = (trace_head_ + 1) % trace_cap_;
  trace_count_ = std::min(trace_count_ + 1, trace_cap_);
}

Feeder::~Feeder() {
  batches_.stop();
  thread_.join();
}

namespace {
bool valid(const FtQueuedArgs& a) {
  if (a.T < 0 || a.k < 1 || a.D <= 0 || a.I <= 0 || !a.ready_flag || !a.done_flag) return false;
  if (a.mode != 0 && a.mode != 1) return false;
  return a.T == 0 || (a.x && a.codes && a.w && a.out && a.gate_up && a.down);
}
}  // namespace

int Feeder::push(const FtQueuedArgs& a) {
  if (!valid(a)) return -2;
  batches_.push(a);
  return 0;
}

int Feeder::push_many(const FtQueuedArgs* const* args, const int64_t* tokens, int64_t n) {
  if (n < 0 || (n > 0 && (!args || !tokens))) return -2;
  many_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (!args[i]) return -2;
    many_[i] = *args[i];
    many_[i].T = tokens[i];
    if (!valid(many_[i])) return -2;
  }
  batches_.push_many(many_.data(), n);
  return 0;
}

void Feeder::drain() { batches_.drain(); }

int Feeder::compute(const FtQueuedArgs& a) {
  const int64_t n = a.T * a.k;
  tok_.clear(), row_.clear(), w_.clear();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = a.codes[i];
    if (c >= 0) continue;
    tok_.push_back(static_cast<int32_t>(i / a.k)), row_.push_back(-1 - c), w_.push_back(a.w[i]);  // rows: the plan checks
  }
  const FtMoeArgs m{a.x, a.T, a.D, a.I, tok_.data(), row_.data(), w_.data(), static_cast<int64_t>(row_.size()),
                    a.gate_up, a.down, a.N, a.fmt, a.act, a.out, a.gate_up_scale, a.down_scale,
                    a.gate_up_bias};
  return run_(m);
}

void Feeder::write_stats(const FtQueuedArgs& a, int64_t ns, int rc) {
  rows_.assign(row_.begin(), row_.end());
  std::sort(rows_.begin(), rows_.end());
  distinct_ = std::unique(rows_.begin(), rows_.end()) - rows_.begin();
  if (!a.stats) return;
  a.stats[0] = distinct_;
  a.stats[1] = static_cast<int64_t>(row_.size());
  a.stats[2] = ns;
  a.stats[3] = rc;
}

void Feeder::run_one(const FtQueuedArgs& a, int64_t t_wait) {
  const int64_t t_ready = steady_now_ns();
  int rc;
  try {
    rc = compute(a);
  } catch (const std::exception&) {  // out of memory for the routes or plans: report, never hang the stream
    rc = -6;
  }
  if (rc != 0 && a.T > 0) std::memset(a.out, 0, sizeof(float) * a.T * a.D);  // never hand back garbage
  if (rc != 0) {
    int expected = 0;
    error_.compare_exchange_strong(expected, rc);
  }
  write_stats(a, steady_now_ns() - t_ready, rc);
  __atomic_store_n(a.done_flag, a.done_value, __ATOMIC_RELEASE);  // out and stats first
  record(t_wait, t_ready, steady_now_ns());
}

void Feeder::loop() {
#ifdef __linux__
  prctl(PR_SET_TIMERSLACK, 1000UL);  // naps of a few microseconds, not the default 50 us slack
#endif
  for (;;) {
    FtQueuedArgs a;
    if (!batches_.next(a)) return;  // stopping, nothing left
    const int64_t t_wait = steady_now_ns();
    if (!batches_.stopping() && batches_.wait_ready(a.ready_flag, a.ready_value, a.mode, spin_ns_)) {
      run_one(a, t_wait);
    } else {  // stopping: release whoever waits on this batch (its out is not computed)
      __atomic_store_n(a.done_flag, a.done_value, __ATOMIC_RELEASE);
    }
    batches_.done();
  }
}

}  // namespace ft
