// The AVX-512 F/BW/VL path (isa_avx512.h says how it is configured).
#include "isa_avx512.h"

ft::IsaOps ft::ops_avx512() { return IsaOps{avx512::phase1_dispatch, avx512::phase2_dispatch, avx512::phase3, OPERANDS_Q16I_FP4, avx512::stream_sum}; }
