// See copier.h.
#include "copier.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <new>

namespace ft {
namespace {

using CtxSetCurrent = int (*)(void*);
using MemcpyHtoD = int (*)(uint64_t, const void*, size_t, void*);
using WriteValue32 = int (*)(void*, uint64_t, uint32_t, unsigned);

}  // namespace

Copier::Copier(int64_t spin_ns) : spin_ns_(spin_ns), thread_([this] { loop(); }) {}

Copier::~Copier() {
  jobs_.stop();
  thread_.join();
}

void Copier::configure(const FtCopyConfig& c) {
  drain();  // the thread is idle; the next push (under the queue's lock) publishes the new config to it
  cfg_ = c;
  ctx_set_ = false;
}

int Copier::push(const FtCopyJob& j) {
  if (!j.ready_flag || !j.list || !j.done_host || j.kv < 0 || (j.mode != 0 && j.mode != 1)) return -2;
  jobs_.push(j);
  return 0;
}

void Copier::drain() { jobs_.drain(); }

int Copier::run(const FtCopyJob& j) {
  const FtCopyConfig& c = cfg_;
  if (c.ctx_set_current && !ctx_set_) {
    if (const int rc = reinterpret_cast<CtxSetCurrent>(c.ctx_set_current)(c.ctx)) return rc;
    ctx_set_ = true;
  }
  const int64_t n = std::min(j.list[0], j.kv);
  const int64_t* rows = j.list + 1;
  const int64_t* slots = j.list + 1 + j.kv;
  for (int64_t e = 0; e < n; ++e)
    if (rows[e] < 0 || rows[e] >= c.num_rows || slots[e] < 0 || slots[e] > c.num_slots) return -4;
  const auto memcpy_htod = reinterpret_cast<MemcpyHtoD>(c.memcpy_htod);
  for (int b = 0; b < c.nbanks; ++b) {  // bank by bank: each bank's rows are contiguous copies
    for (int64_t e = 0; e < n; ++e) {
      const char* src = c.src[b] + rows[e] * c.row_bytes[b];
      const uint64_t dst = c.dst[b] + static_cast<uint64_t>(slots[e] * c.row_bytes[b]);
      if (memcpy_htod) {
        if (const int rc = memcpy_htod(dst, src, static_cast<size_t>(c.row_bytes[b]), c.stream)) return rc;
      } else {
        std::memcpy(reinterpret_cast<void*>(dst), src, static_cast<size_t>(c.row_bytes[b]));
      }
      copies_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (c.write_value32) return reinterpret_cast<WriteValue32>(c.write_value32)(c.stream, j.done_dev, j.done_value, 0);
  __atomic_store_n(j.done_host, j.done_value, __ATOMIC_RELEASE);
  return 0;
}

void Copier::loop() {
  for (;;) {
    FtCopyJob j;
    if (!jobs_.next(j)) return;
    int rc = 0;
    if (!jobs_.stopping() && jobs_.wait_ready(j.ready_flag, j.ready_value, j.mode, spin_ns_)) rc = run(j);
    else rc = -7;  // stopping: released below, nothing copied
    if (rc != 0) {
      if (rc != -7) {
        int expected = 0;
        error_.compare_exchange_strong(expected, rc);
      }
      __atomic_store_n(j.done_host, j.done_value, __ATOMIC_RELEASE);  // never leave a stream waiting
    }
    jobs_.done();
  }
}

}  // namespace ft

extern "C" {

void* ft_copier_create(int spin_us) {
  try {
    return new ft::Copier(int64_t{spin_us} * 1000);
  } catch (const std::exception&) {
    return nullptr;
  }
}
void ft_copier_destroy(void* c) { delete static_cast<ft::Copier*>(c); }
void ft_copier_configure(void* c, const FtCopyConfig* cfg) { static_cast<ft::Copier*>(c)->configure(*cfg); }
// 0 queued; -2 bad job; -6 out of memory.
int ft_copier_push(void* c, const FtCopyJob* j) {
  try {
    return static_cast<ft::Copier*>(c)->push(*j);
  } catch (const std::bad_alloc&) {
    return -6;
  }
}
void ft_copier_drain(void* c) { static_cast<ft::Copier*>(c)->drain(); }
int64_t ft_copier_pending(void* c) { return static_cast<ft::Copier*>(c)->pending(); }
// The first failure since the last call: a CUresult, or -4 (a list entry out of range); 0: none.
int ft_copier_error(void* c) { return static_cast<ft::Copier*>(c)->take_error(); }
int64_t ft_copier_copies(void* c) { return static_cast<ft::Copier*>(c)->copies(); }

}  // extern "C"
