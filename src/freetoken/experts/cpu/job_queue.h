// An in-order job queue served by one thread (the feeder's CPU batches). Any thread
// pushes without blocking on the work; the serving thread takes the front job with next() and removes it with
// done() once it has run, so a job counts as pending from push until done; drain() waits until nothing is
// pending (or the queue stops). stop() wakes the server, which then releases what is still queued without
// running it (stopping() is true) and sees next() return false once the queue is empty.
// Plain C++17.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>

#include "flag_wait.h"

namespace ft {

template <class Job>
class JobQueue {
 public:
  // hot (optional): mirrors pending() too (the worker pool spins longer while it is > 0).
  explicit JobQueue(std::atomic<int64_t>* hot = nullptr) : hot_(hot) {}

  void push(const Job& j) { push_many(&j, 1); }

  // n jobs in order under one lock and one wake-up (a replayed step's layers at once).
  void push_many(const Job* jobs, int64_t n) {
    if (n <= 0) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.insert(queue_.end(), jobs, jobs + n);
      count(n);
    }
    cv_work_.notify_one();
  }

  // Blocks for a job or stop; false: stopping and nothing queued. The job stays queued until done().
  bool next(Job& out) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_work_.wait(lk, [this] { return stop_.load(std::memory_order_acquire) || !queue_.empty(); });
    if (queue_.empty()) return false;
    out = queue_.front();
    return true;
  }

  // The front job (from next()) has run or was released.
  void done() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.pop_front();
      count(-1);
    }
    cv_idle_.notify_all();
  }

  void drain() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_idle_.wait(lk, [this] { return pending_.load(std::memory_order_acquire) == 0 || stop_.load(); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_.store(true, std::memory_order_release);
    }
    cv_work_.notify_all();
  }

  bool stopping() const { return stop_.load(std::memory_order_acquire); }
  // The server's wait for a job's ready flag (flag_wait.h); false: the queue stopped meanwhile.
  bool wait_ready(uint32_t* flag, uint32_t value, int32_t mode, int64_t spin_ns) const {
    return wait_flag(flag, value, mode, spin_ns, stop_);
  }
  int64_t pending() const { return pending_.load(std::memory_order_acquire); }  // queued + running

 private:
  void count(int64_t d) {  // under mu_
    pending_.fetch_add(d, std::memory_order_acq_rel);
    if (hot_) hot_->fetch_add(d, std::memory_order_relaxed);
  }

  std::mutex mu_;
  std::condition_variable cv_work_, cv_idle_;
  std::deque<Job> queue_;
  std::atomic<int64_t> pending_{0};
  std::atomic<int64_t>* hot_;
  std::atomic<bool> stop_{false};
};

}  // namespace ft
