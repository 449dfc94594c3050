// The AVX2 + FMA path's configuration (compiled with -mavx2 -mfma -mf16c): the traits of isa_avx2_s.h, FP4 rows
// by dot_fp4_avx2i.h (its 32-code tail from dot_fp4_avx2.h), and the phases of dot_impl.h in namespace ft::avx2. Included by isa_avx2.cpp, which defines
// ops_avx2, and by bench/fp4_dot.cpp (-DFT_BENCH_AVX2), so the benchmark measures this very configuration.
#pragma once
#include <immintrin.h>

#include "kernel_api.h"

#define FT_ISA_NS avx2
#define FT_ROWS_MAX 2  // batch-1 rows at once (dot_rows.h)
#define FT_NT_MAX 2  // 2 tokens x 4 accumulators = 8 of the 16 ymm registers
#define FT_FP4_Q16 1  // dot_fp4_avx2.h's 32-code form (the rows' tails)
#define FT_FP4_Q16I 1  // FP4 rows on quantize_q16i's operands ...
#define FT_FP4_Q16I_256 1  // ... by dot_fp4_avx2i.h

namespace ft {
namespace avx2 {
#include "isa_avx2_s.h"
}  // namespace avx2
}  // namespace ft

#include "dot_impl.h"
