// AVX-512 F/BW/VL path (compiled with -mavx512f -mavx512bw -mavx512vl -mfma): FMA on widened bf16.
#include <immintrin.h>

#include "kernel_api.h"

#define FT_ISA_NS avx512
#define FT_ROWS_MAX 4  // batch-1 rows at once (dot_rows.h)
#define FT_NT_MAX 4  // 4 tokens x 4 accumulators = 16 of the 32 zmm registers
#define FT_FP4_Q16 1  // FP4 rows by dot_fp4_avx2.h (256-bit: its int16 operand blocks beat the fp32 decode here too)

namespace ft {
namespace avx512 {
#include "isa_avx512_s.h"
}  // namespace avx512
}  // namespace ft

#include "dot_impl.h"

ft::IsaOps ft::ops_avx512() { return IsaOps{avx512::phase1_dispatch, avx512::phase2_dispatch, avx512::phase3, OPERANDS_Q16_FP4, avx512::stream_sum}; }
