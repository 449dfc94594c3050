// The FP4 dot products of the CPU expert kernel alone, one thread, rows in L2 (64 rows of 2,048 codes: 64 KiB):
// what the decode can do when memory is not the limit. Prints packed GB/s for batch-1 row blocking (R rows
// at once, the ISA's cap) and for one row alone (the tile path), MXFP4 and NVFP4, at K = 2,048 (a gate/up row of the
// Qwen3-30B-A3B shape) and K = 768 (a down row, 64 rows of 768 codes). Random codes and scales.
//
// With thread counts as arguments (`/tmp/fp4_dot 6 16`), it also prints, per count N, the same rows-at-once dot
// products on N threads: rows in each thread's L2 (the decode's rate when every core runs it), and streamed from a
// 1 GiB pool of rows in DRAM (each thread walking its own contiguous slice, 64 rows a call, as a kernel unit does),
// beside the kernel's own streaming read (stream_sum) of the same bytes on N threads. The kernel's plan, phases and
// barriers are not in it: the gap between the DRAM row and bench/cpu_formats.py's kernel is theirs.
//
// AVX512-BF16, AVX-512 without it, AVX-512 with VBMI and VNNI, AVX2 with AVX-VNNI, then AVX2 (from the repository
// root):
//   g++ -std=c++17 -O3 -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512bf16
//       -pthread -Isrc/freetoken/experts/cpu bench/fp4_dot.cpp -o /tmp/fp4_dot && /tmp/fp4_dot [THREADS ...]
//   g++ -std=c++17 -O3 -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -DFT_BENCH_AVX512
//       -pthread -Isrc/freetoken/experts/cpu bench/fp4_dot.cpp -o /tmp/fp4_dot5 && /tmp/fp4_dot5
//   g++ -std=c++17 -O3 -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512vbmi -mavx512vnni
//       -DFT_BENCH_AVX512VBMI -pthread -Isrc/freetoken/experts/cpu bench/fp4_dot.cpp -o /tmp/fp4_dot6 && /tmp/fp4_dot6
//   g++ -std=c++17 -O3 -mavx2 -mfma -mf16c -mavxvnni -DFT_BENCH_AVX2VNNI
//       -pthread -Isrc/freetoken/experts/cpu bench/fp4_dot.cpp -o /tmp/fp4_dot7 && /tmp/fp4_dot7
//   g++ -std=c++17 -O3 -mavx2 -mfma -mf16c -DFT_BENCH_AVX2
//       -pthread -Isrc/freetoken/experts/cpu bench/fp4_dot.cpp -o /tmp/fp4_dot2 && /tmp/fp4_dot2
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#if defined(FT_BENCH_AVX2)
#include "isa_avx2.h"  // the kernel's own AVX2 configuration
#elif defined(FT_BENCH_AVX2VNNI)
#include "isa_avx2vnni.h"  // the AVX2 configuration with its AVX-VNNI FP4 form
#elif defined(FT_BENCH_AVX512VBMI)
#include "isa_avx512vbmi.h"  // the AVX-512 configuration with its VBMI / VNNI FP4 form
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

// fn(t) on n threads started together; seconds from the common start to the last one's end.
template <class Fn>
static double on_threads(int n, Fn fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  std::vector<std::chrono::steady_clock::time_point> end(n);
  for (int t = 0; t < n; ++t)
    ts.emplace_back([&, t] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {}
      fn(t);
      end[t] = std::chrono::steady_clock::now();
    });
  while (ready.load() < n) {}
  const auto t0 = std::chrono::steady_clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : ts) th.join();
  return std::chrono::duration<double>(*std::max_element(end.begin(), end.end()) - t0).count();
}

// N threads: the dot products with rows in each thread's L2, then streamed from a pool in DRAM, and the streaming
// read of the same pool (best of 3 each; packed GB/s, scales not counted).
template <bool NV>
static void run_threads(const char* fmt, int64_t K, int n) {
  constexpr int64_t NR = 64;
  const int64_t row_bytes = K / 2, srow = NV ? K / 16 + 4 : K / 32;  // FmtFP4::row's scale-row bytes
  const int64_t rows = (int64_t{1} << 30) / row_bytes / (NR * n) * (NR * n);  // 1 GiB, whole 64-row calls each
  std::vector<uint8_t> w(rows * row_bytes), s(rows * srow + 64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  for (auto& b : s) b = static_cast<uint8_t>(120 + rand() % 8);
  std::vector<float> x(K), qs(K / 32);
  for (auto& v : x) v = rand() / static_cast<float>(RAND_MAX) - 0.5f;
  std::vector<int16_t> q(K);
#ifdef FT_FP4_Q16I
  ft::quantize_q16i(x.data(), 0, K, K, q.data(), qs.data());
#endif
  std::vector<uint16_t> hi(K), lo(K);
  for (int64_t k = 0; k < K; ++k) {
    const int64_t j = ft::fp4_dp_pos(k, K);
    hi[j] = ft::f32_to_bf16(x[k]), lo[j] = ft::f32_to_bf16(x[k] - ft::bf16_to_f32(hi[j]));
  }
  Operands o{};
  o.nt = 1, o.f[0] = x.data(), o.hi[0] = hi.data(), o.lo[0] = lo.data(), o.q[0] = q.data(), o.qs[0] = qs.data();
#ifdef FT_DOT_BF16
  constexpr bool kDp = true;
#else
  constexpr bool kDp = false;
#endif
  std::vector<float> sinks(n * 16, 0.f);
  const int64_t per = rows / n, l2_iters = 20000 * 2048 / K;
  auto dram = [&](int t) {
    const ft::Bank bank{w.data(), s.data()};
    float res[NR], acc = 0.f;
    for (int64_t r = t * per; r < (t + 1) * per; r += NR) {
      dot_row_run<FmtFP4<NV>, kDp>(bank, r, NR, K, o, res, FT_ROWS_MAX);
      acc += res[0] + res[NR - 1];
    }
    sinks[t * 16] += acc;
  };
  auto l2 = [&](int t) {  // each thread's own 64 rows of the pool, again and again
    const ft::Bank bank{w.data() + t * per * row_bytes, s.data() + t * per * srow};
    float res[NR], acc = 0.f;
    for (int64_t it = 0; it < l2_iters / 4; ++it) {
      dot_row_run<FmtFP4<NV>, kDp>(bank, 0, NR, K, o, res, FT_ROWS_MAX);
      acc += res[0] + res[NR - 1];
    }
    sinks[t * 16] += acc;
  };
  std::vector<uint64_t> sums(n * 8);
  auto read = [&](int t) {
    sums[t * 8] += stream_sum(reinterpret_cast<const uint64_t*>(w.data() + t * per * row_bytes), per * row_bytes / 8);
  };
  double bd = 1e9, bl = 1e9, br = 1e9;
  for (int rep = 0; rep < 3; ++rep) {  // alternating, best of 3
    bd = std::min(bd, on_threads(n, dram));
    br = std::min(br, on_threads(n, read));
    bl = std::min(bl, on_threads(n, l2));
  }
  const double gd = rows * row_bytes / bd / 1e9, gr = rows * row_bytes / br / 1e9;
  const double gl = double(n) * (l2_iters / 4) * NR * row_bytes / bl / 1e9;
  std::printf("| %s | %lld | %d | %.1f | %.1f | %.1f | %.0f%% |\n", fmt, static_cast<long long>(K), n, gl, gd, gr,
              100 * gd / gr);
  if (sinks[0] == 1234.5f || sums[0] == 42) std::printf("(sink)\n");
}

int main(int argc, char** argv) {
  std::printf("| format | K | batch-1 rows | packed GB/s, one thread |\n|---|---|---|---|\n");
  for (const int64_t K : {2048, 768}) {
    run<false>("MXFP4", K);
    run<true>("NVFP4", K);
  }
  if (argc < 2) return 0;
  std::printf("\n| format | K | threads | rows in L2, GB/s | rows from DRAM, GB/s | streaming read, GB/s "
              "| DRAM dot / read |\n|---|---|---|---|---|---|---|\n");
  for (int a = 1; a < argc; ++a) {
    const int n = std::max(1, atoi(argv[a]));
    for (const int64_t K : {2048, 768}) {
      run_threads<false>("MXFP4", K, n);
      run_threads<true>("NVFP4", K, n);
    }
  }
  return 0;
}
