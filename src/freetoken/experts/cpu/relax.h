// A polite busy-wait hint for spinning threads (pause on x86, yield on Arm). Plain C++17.
#pragma once

namespace ft {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace ft
