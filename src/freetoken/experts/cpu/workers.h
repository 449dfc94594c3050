// A persistent pool of worker threads, each pinned to its own core, that run "jobs": a job is a
// sequence of steps, a step a number of independent units. Units are handed out one at a time;
// whoever finishes a step's last unit opens the next step, so no participant is ever waited for
// (a descheduled or late worker holds nothing up) and the thread that waits for a job may take
// units itself. Idle threads sleep on a condition variable, after an optional short spin; while the
// pool is "hot" (hot() > 0: the feeder holds queued batches, the next one comes within a layer's time)
// they poll for up to hot_spin_ns instead, so a decode layer's batch starts without a wake-up.
// Plain C++17, no ISA flags.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ft {

class Job {
 public:
  virtual ~Job() = default;
  virtual int64_t steps() const = 0;
  virtual int64_t units(int64_t step) const = 0;
  // Called concurrently for distinct units; every unit of a step runs before any unit of the next.
  virtual void run(int64_t step, int64_t unit) = 0;
};

class WorkerPool {
 public:
  // n workers; cpus: null or n CPU ids (worker k pinned to cpus[k]); spin_ns: how long a waiting
  // thread polls before it sleeps (0: sleeps at once; never spin on machines with few cores).
  WorkerPool(int n, const int* cpus, int64_t spin_ns, int64_t hot_spin_ns = 0);
  ~WorkerPool();

  int threads() const { return static_cast<int>(threads_.size()); }
  bool busy() const { return live_.load(std::memory_order_acquire); }
  // Blocks until no worker is inside a job any more: the state a job reads may then change.
  void quiesce();
  // Starts `job` (not busy; after quiesce(); the job must live until it is done).
  void start(Job* job);
  // Blocks until the job is done; with help, this thread takes units too meanwhile.
  void wait(bool help);
  // Batches known to be coming (the feeder counts its queue here); > 0 lengthens the idle spin.
  std::atomic<int64_t>& hot() { return hot_; }
  // Steady-clock ns at which the last job's steps [0, kTracedSteps) opened (0: no units) and it finished;
  // read after wait() (for the feeder's batch trace).
  static constexpr int kTracedSteps = 4;
  const int64_t* step_open_ns() const { return step_open_ns_; }
  int64_t finish_ns() const { return finish_ns_; }

 private:
  struct Step {
    std::atomic<int64_t> next{0}, done{0};
    int64_t units = 0;
  };
  void worker(int cpu);
  void participate();
  void advance(int64_t step);
  void finish();
  template <class Pred>
  void sleep_until(std::condition_variable& cv, Pred pred);
  template <class Pred>
  bool spin_until(Pred pred);

  const int64_t spin_ns_;
  const int64_t hot_spin_ns_;  // spin while hot (never below spin_ns_; 0 when spin_ns_ is 0)
  std::atomic<int64_t> hot_{0};
  std::vector<std::thread> threads_;
  std::mutex mu_;  // guards sleeping (the state itself is atomics)
  std::condition_variable cv_work_, cv_done_, cv_idle_;
  std::atomic<bool> stop_{false}, live_{false};
  std::atomic<uint64_t> gen_{0};   // job generation
  std::atomic<int> active_{0};     // workers inside a job
  std::atomic<int64_t> step_{0};   // the open step (== nsteps_ when the job is done)
  // the current job: written by start() only while no worker is inside a job
  Job* job_ = nullptr;
  int64_t nsteps_ = 0;
  std::unique_ptr<Step[]> step_state_;
  int64_t step_cap_ = 0;
  int64_t step_open_ns_[kTracedSteps] = {};
  int64_t finish_ns_ = 0;
};

}  // namespace ft
