// AVX-512 + AVX512-BF16 path (also -mavx512bf16): bf16 banks use vdpbf16ps on a hi/lo bf16 split of
// the fp32 operand; fp32 banks use the plain AVX-512 FMA loop.
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

ft::IsaOps ft::ops_avx512bf16() { return IsaOps{avx512bf16::phase1_dispatch, avx512bf16::phase2_dispatch, avx512bf16::phase3, OPERANDS_BF16, avx512bf16::stream_sum}; }
