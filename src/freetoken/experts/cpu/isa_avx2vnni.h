// The AVX2 path with AVX-VNNI (compiled with -mavxvnni beside the AVX2 path's flags; Intel's Alder Lake and later
// client cores, Sapphire Rapids and later Xeons): isa_avx2.h's configuration, whose FP4 rows (dot_fp4_avx2i.h,
// FT_FP4_AVXVNNI) multiply-add by vpdpwssd: the same integer sums, so the same bits as the AVX2 path. The phases of
// dot_impl.h in namespace ft::avx2vnni. Included by isa_avx2vnni.cpp, which defines ops_avx2vnni, and by
// bench/fp4_dot.cpp (-DFT_BENCH_AVX2VNNI).
#pragma once
#include <immintrin.h>

#include "kernel_api.h"

#define FT_ISA_NS avx2vnni
#define FT_ROWS_MAX 2  // batch-1 rows at once (dot_rows.h)
#define FT_NT_MAX 2  // 2 tokens x 4 accumulators = 8 of the 16 ymm registers
#define FT_FP4_Q16 1  // dot_fp4_avx2.h's 32-code form (the rows' tails)
#define FT_FP4_Q16I 1  // FP4 rows on quantize_q16i's operands ...
#define FT_FP4_Q16I_256 1  // ... by dot_fp4_avx2i.h ...
#define FT_FP4_AVXVNNI 1  // ... with its vpdpwssd sums

namespace ft {
namespace avx2vnni {
#include "isa_avx2_s.h"
}  // namespace avx2vnni
}  // namespace ft

#include "dot_impl.h"
