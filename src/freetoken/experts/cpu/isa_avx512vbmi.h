// The AVX-512 path with AVX512-VBMI and AVX512-VNNI (compiled with -mavx512vbmi -mavx512vnni beside the AVX-512
// path's flags; Ice Lake and later Intel cores, AMD Zen 4 and later): isa_avx512.h's configuration, whose FP4 rows
// (dot_fp4_avx512.h, FT_FP4_VBMI) decode by vpermb and multiply-add by vpdpwssd: the same integer sums, so the same
// bits as the AVX-512 path, in fewer instructions. The phases of dot_impl.h in namespace ft::avx512vbmi. Included by
// isa_avx512vbmi.cpp, which defines ops_avx512vbmi, and by bench/fp4_dot.cpp (-DFT_BENCH_AVX512VBMI).
#pragma once
#include <immintrin.h>

#include "kernel_api.h"

#define FT_ISA_NS avx512vbmi
#define FT_ROWS_MAX 4  // batch-1 rows at once (dot_rows.h)
#define FT_NT_MAX 4  // 4 tokens x 4 accumulators = 16 of the 32 zmm registers
#define FT_FP4_Q16 1  // dot_fp4_avx2.h's 32-code form (the rows' tails)
#define FT_FP4_Q16I 1  // FP4 rows by dot_fp4_avx512.h ...
#define FT_FP4_VBMI 1  // ... with its vpermb decode and vpdpwssd sums

namespace ft {
namespace avx512vbmi {
#include "isa_avx512_s.h"
}  // namespace avx512vbmi
}  // namespace ft

#include "dot_impl.h"
