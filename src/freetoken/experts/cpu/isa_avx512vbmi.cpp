// The AVX-512 path with AVX512-VBMI and AVX512-VNNI (isa_avx512vbmi.h says how it is configured).
#include "isa_avx512vbmi.h"

ft::IsaOps ft::ops_avx512vbmi() { return IsaOps{avx512vbmi::phase1_dispatch, avx512vbmi::phase2_dispatch, avx512vbmi::phase3, OPERANDS_Q16I_FP4, avx512vbmi::stream_sum}; }
