// The AVX-512 F/BW/VL path's configuration (compiled with -mavx512f -mavx512bw -mavx512vl -mfma): FMA on widened bf16,
// FP4 rows by dot_fp4_avx512.h (int16 operand blocks, 512-bit decode; its 32-code tail from dot_fp4_avx2.h), and the
// phases of dot_impl.h in namespace ft::avx512. Included by isa_avx512.cpp, which defines ops_avx512, and by
// bench/fp4_dot.cpp (-DFT_BENCH_AVX512), so the benchmark measures this very configuration.
#pragma once
#include <immintrin.h>

#include "kernel_api.h"

#define FT_ISA_NS avx512
#define FT_ROWS_MAX 4  // batch-1 rows at once (dot_rows.h)
#define FT_NT_MAX 4  // 4 tokens x 4 accumulators = 16 of the 32 zmm registers
#define FT_FP4_Q16 1  // dot_fp4_avx2.h's 32-code form (the rows' tails)
#define FT_FP4_Q16I 1  // FP4 rows by dot_fp4_avx512.h

namespace ft {
namespace avx512 {
#include "isa_avx512_s.h"
}  // namespace avx512
}  // namespace ft

#include "dot_impl.h"
