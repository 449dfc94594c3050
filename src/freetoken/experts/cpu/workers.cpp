// See workers.h.
#include "workers.h"
#include "relax.h"

#include <algorithm>
#include <chrono>

#ifdef __linux__
#include <sched.h>
#endif

namespace ft {

// Polls `pred` for up to spin_ns_, or hot_spin_ns_ while hot (spin_ns_ 0: once); true when it became
// true meanwhile.
template <class Pred>
bool WorkerPool::spin_until(Pred pred) {
  if (spin_ns_ <= 0) return pred();
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t i = 1;; ++i) {
    if (pred()) return true;
    cpu_relax();
    if ((i & 63) == 0) {
      const auto waited = std::chrono::steady_clock::now() - t0;
      if (waited > std::chrono::nanoseconds(spin_ns_)) {  // past the plain spin: on only while hot, yielding
        if (hot_.load(std::memory_order_relaxed) <= 0 || waited > std::chrono::nanoseconds(hot_spin_ns_)) {
          return pred();
        }
        std::this_thread::yield();
      }
    }
  }
}

template <class Pred>
void WorkerPool::sleep_until(std::condition_variable& cv, Pred pred) {
  if (spin_until(pred)) return;
  std::unique_lock<std::mutex> lk(mu_);
  cv.wait(lk, pred);  // whoever makes pred true changes state, then notifies under/after mu_
}

WorkerPool::WorkerPool(int n, const int* cpus, int64_t spin_ns, int64_t hot_spin_ns)
    : spin_ns_(spin_ns), hot_spin_ns_(spin_ns > 0 ? std::max(spin_ns, hot_spin_ns) : 0) {
  for (int k = 0; k < n; ++k) threads_.emplace_back([this, cpu = cpus ? cpus[k] : -1] { worker(cpu); });
}

WorkerPool::~WorkerPool() {
  wait(true);
  quiesce();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true, std::memory_order_release);
  }
  cv_work_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::quiesce() {
  sleep_until(cv_idle_, [this] { return active_.load(std::memory_order_seq_cst) == 0; });
}

void WorkerPool::start(Job* job) {
  const int64_t n = job->steps();
  if (n > step_cap_) step_state_.reset(new Step[n]), step_cap_ = n;
  for (int64_t s = 0; s < n; ++s) {
    step_state_[s].next.store(0, std::memory_order_relaxed);
    step_state_[s].done.store(0, std::memory_order_relaxed);
    step_state_[s].units = job->units(s);
  }
  job_ = job, nsteps_ = n;
  int64_t s0 = 0;
  while (s0 < n && step_state_[s0].units == 0) ++s0;
  for (int64_t& t : step_open_ns_) t = 0;
  if (s0 < kTracedSteps) step_open_ns_[s0] = steady_now_ns();
  if (s0 == n) return finish();  // nothing to compute (e.g. no tokens)
  {
    std::lock_guard<std::mutex> lk(mu_);
    step_.store(s0, std::memory_order_relaxed);
    gen_.fetch_add(1, std::memory_order_relaxed);
    live_.store(true, std::memory_order_seq_cst);  // publishes the job to workers that load it
  }
  cv_work_.notify_all();
}

void WorkerPool::wait(bool help) {
  if (help && busy()) participate();
  sleep_until(cv_done_, [this] { return !busy(); });
}

void WorkerPool::participate() {
  for (;;) {
    const int64_t s = step_.load(std::memory_order_acquire);
    if (s >= nsteps_) return;
    Step& st = step_state_[s];
    const int64_t u = st.next.fetch_add(1, std::memory_order_relaxed);
    if (u < st.units) {
      job_->run(s, u);
      if (st.done.fetch_add(1, std::memory_order_acq_rel) + 1 == st.units) advance(s);
      continue;
    }
    sleep_until(cv_work_, [this, s] { return step_.load(std::memory_order_acquire) != s; });
  }
}

// The last unit of step `s` is done (its writes acquired through the done counter): open the next
// step with units, or finish the job.
void WorkerPool::advance(int64_t s) {
  int64_t next = s + 1;
  while (next < nsteps_ && step_state_[next].units == 0) ++next;
  if (next == nsteps_) return finish();
  if (next < kTracedSteps) step_open_ns_[next] = steady_now_ns();
  {
    std::lock_guard<std::mutex> lk(mu_);
    step_.store(next, std::memory_order_release);
  }
  cv_work_.notify_all();
}

void WorkerPool::finish() {
  finish_ns_ = steady_now_ns();
  {
    std::lock_guard<std::mutex> lk(mu_);
    step_.store(nsteps_, std::memory_order_release);
    live_.store(false, std::memory_order_seq_cst);
  }
  cv_work_.notify_all();
  cv_done_.notify_all();
}

void WorkerPool::worker(int cpu) {
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
  uint64_t seen = 0;  // the last job generation this worker took part in
  for (;;) {
    sleep_until(cv_work_, [this, &seen] {
      return stop_.load(std::memory_order_acquire) ||
             (live_.load(std::memory_order_acquire) && gen_.load(std::memory_order_acquire) != seen);
    });
    if (stop_.load(std::memory_order_acquire)) return;
    // Register, then re-check: start() rebuilds a job's state only after quiesce() saw no one
    // registered, so a worker that sees live_ here sees a complete job.
    active_.fetch_add(1, std::memory_order_seq_cst);
    if (live_.load(std::memory_order_seq_cst)) {
      seen = gen_.load(std::memory_order_acquire);
      participate();
    }
    if (active_.fetch_sub(1, std::memory_order_seq_cst) == 1) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_idle_.notify_all();
    }
  }
}

}  // namespace ft
