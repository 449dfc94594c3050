// The AVX2 + FMA path (isa_avx2.h says how it is configured).
#include "isa_avx2.h"

ft::IsaOps ft::ops_avx2() { return IsaOps{avx2::phase1_dispatch, avx2::phase2_dispatch, avx2::phase3, OPERANDS_Q16I_FP4, avx2::stream_sum}; }
