// Spinning threads' helpers: a polite busy-wait hint (pause on x86, yield on Arm) and the steady clock.
// Plain C++17.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

namespace ft {

inline int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// How long threads poll while batches are known to be coming (a queued decode layer's batch starts
// within a layer's time; longer waits mean the GPU is busy with something else: sleep then).
constexpr int64_t kHotSpinNs = 2'000'000;

// One iteration of a long poll: a pause, and every 64th time a yield, so a runnable thread that shares
// this core (the engine thread, when workers take every core) runs at once instead of after a time slice.
inline void spin_step(uint32_t i) {
  if ((i & 63) == 0) {
    std::this_thread::yield();
  } else {
    cpu_relax();
  }
}

}  // namespace ft
