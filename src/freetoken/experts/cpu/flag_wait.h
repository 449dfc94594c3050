// Waiting for a ready flag the GPU stream writes into pinned host memory (nobody can notify the waiting
// thread): the feeder's queued CPU batches. Plain C++17.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "relax.h"

namespace ft {

// mode 0 (sequence flags): reached once (int32)(*flag - value) >= 0; mode 1 (toggle flags, replayed CUDA
// graphs whose written values are fixed): reached once *flag == value.
inline bool flag_reached(const uint32_t* flag, uint32_t value, int32_t mode) {
  const uint32_t v = __atomic_load_n(flag, __ATOMIC_ACQUIRE);
  return mode == 1 ? v == value : static_cast<int32_t>(v - value) >= 0;
}

constexpr int64_t kMaxNapNs = 50'000;  // longest nap while waiting for a flag

// Waits until the flag is reached (true) or `stop` is set (false). With spin_ns > 0 it polls for at least
// kHotSpinNs (a queued decode layer's flag comes within a layer's time), yielding every 64th poll, then naps
// 2 us doubling to 50 us; spin_ns 0 naps at once. Toggle flags (mode 1) are re-armed (reset to 0) once seen.
inline bool wait_flag(uint32_t* flag, uint32_t value, int32_t mode, int64_t spin_ns, const std::atomic<bool>& stop) {
  const int64_t spin = spin_ns > 0 ? std::max(spin_ns, kHotSpinNs) : 0;
  const int64_t t0 = steady_now_ns();
  uint32_t naps = 0, spins = 0;  // naps counted from the end of the spin: the first nap is the shortest
  while (!flag_reached(flag, value, mode)) {
    if (stop.load(std::memory_order_acquire)) return false;
    ++spins;
    if (spin > 0 && ((spins & 63) != 0 || steady_now_ns() - t0 < spin)) {
      spin_step(spins);
      continue;
    }
    const int64_t nap = std::min<int64_t>(kMaxNapNs, int64_t{2000} << std::min<uint32_t>(naps++, 5));
    std::this_thread::sleep_for(std::chrono::nanoseconds(nap));
  }
  if (mode == 1) __atomic_store_n(flag, 0u, __ATOMIC_RELAXED);  // re-arm
  return true;
}

}  // namespace ft
