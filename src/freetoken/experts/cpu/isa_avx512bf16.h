// The AVX-512 + AVX512-BF16 path's configuration (also -mavx512bf16): bf16 and FP4 banks use vdpbf16ps on a hi/lo
// bf16 split of the fp32 operand (dot_fp4_dp.h for FP4); fp32 banks use the plain AVX-512 FMA loop. The phases of
// dot_impl.h in namespace ft::avx512bf16. Included by isa_avx512bf16.cpp, which defines ops_avx512bf16, and by
// bench/fp4_dot.cpp, so the benchmark measures this very configuration.
#pragma once
#include <immintrin.h>

#include "kernel_api.h"

#define FT_ISA_NS avx512bf16
#define FT_ROWS_MAX 4  // batch-1 rows at once (dot_rows.h)
#define FT_NT_MAX 4
#define FT_DOT_BF16 1

namespace ft {
namespace avx512bf16 {
#include "isa_avx512_s.h"
}  // namespace avx512bf16
}  // namespace ft

#include "dot_impl.h"
