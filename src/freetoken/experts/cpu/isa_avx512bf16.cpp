// The AVX-512 + AVX512-BF16 path (isa_avx512bf16.h says how it is configured).
#include "isa_avx512bf16.h"

ft::IsaOps ft::ops_avx512bf16() { return IsaOps{avx512bf16::phase1_dispatch, avx512bf16::phase2_dispatch, avx512bf16::phase3, OPERANDS_BF16, avx512bf16::stream_sum}; }
