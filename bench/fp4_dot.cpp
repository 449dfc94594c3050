// The FP4 dot products of the CPU expert kernel alone, one thread, rows in L2 (64 rows of 2,048 codes: 64 KiB):
// what the decode can do when memory is not the limit. Prints packed GB/s for batch-1 row blocking (R rows
// at once, the ISA's cap) and for one row alone (the tile path), MXFP4 and NVFP4, at K = 2,048 (a gate/up row of the
// Qwen3-30B-A3B shape) and K = 768 (a down row, 64 rows of 768 codes). Random codes and scales.
//
// AVX512-BF16, AVX-512 without it, then AVX2 (from the repository root):
//   g++ -std=c++17 -O3 -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512bf16
//       -Isrc/freetoken/experts/cpu bench/fp4_dot.cpp -o /tmp/fp4_dot && /tmp/fp4_dot
//   g++ -std=c++17 -O3 -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -DFT_BENCH_AVX512
//       -Isrc/freetoken/experts/cpu bench/fp4_dot.cpp -o /tmp/fp4_dot5 && /tmp/fp4_dot5
//   g++ -std=c++17 -O3 -mavx2 -mfma -mf16c -DFT_BENCH_AVX2
//       -Isrc/freetoken/experts/cpu bench/fp4_dot.cpp -o /tmp/fp4_dot2 && /tmp/fp4_dot2
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#if defined(FT_BENCH_AVX2)
#include "isa_avx2.h"  // the kernel's own AVX2 configuration
#elif defined(FT_BENCH_AVX512)
#include "isa_avx512.h"  // the kernel's own AVX-512 (no BF16) configuration
#else
#include "isa_avx512bf16.h"  // the kernel's own AVX512-BF16 configuration
#endif

using namespace ft::FT_ISA_NS;

template <bool NV>
static void run(const char* fmt, int64_t K) {
  constexpr int64_t NR = 64;
  const int64_t kIters = 20000 * 2048 / K;  // the same bytes per timing at every K
  std::vector<uint8_t> w(NR * K / 2), s(NR * (K / 16 + 4));
  for (auto& b : w) b = static_cast<uint8_t>(rand());
  for (auto& b : s) b = static_cast<uint8_t>(120 + rand() % 8);  // NVFP4's multiplier bytes too: a normal float
  std::vector<float> x(K);
  for (auto& v : x) v = rand() / static_cast<float>(RAND_MAX) - 0.5f;
  std::vector<uint16_t> hi(K), lo(K);
  for (int64_t k = 0; k < K; ++k) {
    const int64_t j = ft::fp4_dp_pos(k, K);
    hi[j] = ft::f32_to_bf16(x[k]), lo[j] = ft::f32_to_bf16(x[k] - ft::bf16_to_f32(hi[j]));
  }
  std::vector<int16_t> q(K);
  std::vector<float> qs(K / 32);
#ifdef FT_FP4_Q16I
  ft::quantize_q16i(x.data(), 0, K, K, q.data(), qs.data());
#endif
  const ft::Bank bank{w.data(), s.data()};
  Operands o{};
  o.nt = 1, o.f[0] = x.data(), o.hi[0] = hi.data(), o.lo[0] = lo.data(), o.q[0] = q.data(), o.qs[0] = qs.data();
#ifdef FT_DOT_BF16
  constexpr bool kDp = true;  // the AVX512-BF16 build
#else
  constexpr bool kDp = false;
#endif
  float res[NR], sink = 0.f;
  auto bench = [&](const char* name, auto fn) {
    double best = 1e9;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t it = 0; it < kIters; ++it) {
        fn();
        for (int64_t r = 0; r < NR; ++r) sink += res[r];  // every row's result read: no row's work is dropped
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("| %s | %lld | %s | %.1f |\n", fmt, static_cast<long long>(K), name, kIters * NR * K / 2 / best / 1e9);
  };
  bench(FT_ROWS_MAX == 4 ? "rows 4" : "rows 2", [&] { dot_row_run<FmtFP4<NV>, kDp>(bank, 0, NR, K, o, res, FT_ROWS_MAX); });
  bench("rows 1", [&] { dot_row_run<FmtFP4<NV>, kDp>(bank, 0, NR, K, o, res, 1); });
  if (sink == 1234.5f) std::printf("(sink)\n");
}

int main() {
  std::printf("| format | K | batch-1 rows | packed GB/s, one thread |\n|---|---|---|---|\n");
  for (const int64_t K : {2048, 768}) {
    run<false>("MXFP4", K);
    run<true>("NVFP4", K);
  }
  return 0;
}
