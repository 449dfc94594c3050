// The AVX2 path with AVX-VNNI (isa_avx2vnni.h says how it is configured).
#include "isa_avx2vnni.h"

ft::IsaOps ft::ops_avx2vnni() { return IsaOps{avx2vnni::phase1_dispatch, avx2vnni::phase2_dispatch, avx2vnni::phase3, OPERANDS_Q16I_FP4, avx2vnni::stream_sum}; }
