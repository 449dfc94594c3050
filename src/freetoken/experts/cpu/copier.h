// Copy-engine fills for the slot cache (prototype): the GPU stream writes a layer's fill list (count, pool
// rows, slots) into pinned host memory and then a ready flag; this thread, which had the job queued before,
// reads the list once the flag is reached and issues one host->device copy per bank and fill on its own
// CUDA stream (the copy engine, not SM loads), then a stream write of the done flag the compute stream
// waits on before the GEMM. The CUDA driver entry points come as addresses from Python (no CUDA headers);
// without them (tests) the copies are host memcpys and the done flag is written directly.
// Plain C++17.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "job_queue.h"

extern "C" struct FtCopyConfig {
  void* ctx_set_current;  // CUresult (*)(CUcontext), or null
  void* memcpy_htod;      // CUresult (*)(CUdeviceptr dst, const void* src, size_t bytes, CUstream), or null
  void* write_value32;    // CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned), or null
  void* ctx;              // CUcontext
  void* stream;           // CUstream of the copies
  int32_t nbanks;
  const char* src[4];   // host pool base of each bank
  uint64_t dst[4];      // device slot-bank base of each bank (a host address when memcpy_htod is null)
  int64_t row_bytes[4];  // bytes of one pool row / slot of each bank
  int64_t num_rows, num_slots;  // bounds of the list's entries (out of range: the job fails)
};

extern "C" struct FtCopyJob {
  uint32_t* ready_flag;  // start once (int32)(*ready_flag - ready_value) >= 0 (mode 0), == (mode 1, then reset to 0)
  uint32_t ready_value;
  int32_t mode;
  const int64_t* list;  // pinned [1 + 2 * kv]: count, pool rows [kv], slots [kv] (written by the GPU stream)
  int64_t kv;
  uint64_t done_dev;     // the done flag's device address (stream write)
  uint32_t* done_host;   // the same flag's host address (direct write: tests, and failures)
  uint32_t done_value;
};

namespace ft {

class Copier {
 public:
  explicit Copier(int64_t spin_ns);
  ~Copier();  // abandons queued jobs, setting their done flags, so no stream waits forever
  // Before the first job (or while idle): the driver entry points, stream and banks.
  void configure(const FtCopyConfig& c);
  int push(const FtCopyJob& j);  // 0 queued; -2 bad job
  void drain();
  int64_t pending() const { return jobs_.pending(); }
  int take_error() { return error_.exchange(0); }
  int64_t copies() const { return copies_.load(std::memory_order_relaxed); }  // host->device copies issued

 private:
  void loop();
  int run(const FtCopyJob& j);  // 0, or a CUresult / -4 (entry out of range)

  const int64_t spin_ns_;
  FtCopyConfig cfg_{};
  bool ctx_set_ = false;
  JobQueue<FtCopyJob> jobs_;
  std::atomic<int64_t> copies_{0};
  std::atomic<int> error_{0};
  std::thread thread_;  // last
};

}  // namespace ft
