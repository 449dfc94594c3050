// FP4 group scales for the AVX-512 FP4 paths (dot_fp4_dp.h, dot_fp4_avx512.h), whose 128-code blocks lay element
// 8i .. 8i + 7 on fp32 lane i: a span's scales decoded 16 at a time, then one permute per block. Included by those
// headers inside their ISA namespace, after FmtFP4.
#pragma once

// A row's group scales (FmtFP4's own values, bit for bit), decoded 16 at a time: the 256 codes' (NVFP4) or 512
// codes' (MXFP4) whose scale bytes one masked 16-byte load holds; then a block's lane vector is one permute.
template <bool NV>
struct Fp4Scales {
  static constexpr int64_t kG = NV ? 16 : 32, kSpan = 16 * kG;
  // The scales of codes [k, min(K, k + kSpan)), k a multiple of kSpan.
  static inline __m512 decode(const Fp4Row& r, int64_t k, int64_t K) {
    const int64_t g = k / kG, n = imin(16, K / kG - g);
    // Lanes past a row's last group (its last span: MXFP4 rows of 768 or 2,880 codes) read a normal scale, never
    // read after: e8m0's 0 would make a subnormal, and each multiply of one took a microcode assist on the H100
    // host (MXFP4 768-code rows 3.6 GB/s a thread against 7.0 for NVFP4's, bench/fp4_dot.cpp, 2026-12-07).
    const __m128i b = _mm_mask_loadu_epi8(_mm_set1_epi8(NV ? 0 : 127), static_cast<__mmask16>((1u << n) - 1), r.s + g);
    if constexpr (NV) {  // e4m3 -> fp16 (values / 256, exact: S::load_fp8x2's trick) -> fp32, then * mult / 2 * 256
      const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7),
                                         _mm256_set1_epi16(static_cast<short>(0xBFFF)));
      return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(r.mult * 128.f));
    } else {  // e8m0 -> 2^(e - 127) (code 0: 2^-127, a subnormal), then / 2
      const __m512i e = _mm512_cvtepu8_epi32(b);
      const __m512i u = _mm512_mask_mov_epi32(_mm512_slli_epi32(e, 23), _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                                              _mm512_set1_epi32(0x00400000));
      return _mm512_mul_ps(_mm512_castsi512_ps(u), _mm512_set1_ps(0.5f));
    }
  }
  // The index of the span's scale that fp32 lane i of a whole block at `off` codes into the span takes (the
  // block's first group, plus i / 4 for MXFP4 or i / 2 for NVFP4).
  static inline __m512i block_index(int64_t off) {
    const __m512i lane = NV ? _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0)
                            : _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    return _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(off / kG)));
  }
  // A tail block's (32 codes at `off` into the span, element order) scale per lane: MXFP4 one scale; NVFP4 lanes
  // 0-7 the first group's, lanes 8-15 the second's.
  static inline __m512 tail_lanes(__m512 s, int64_t off) {
    const __m512i base = NV ? _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0) : _mm512_setzero_si512();
    return _mm512_permutexvar_ps(_mm512_add_epi32(base, _mm512_set1_epi32(static_cast<int>(off / kG))), s);
  }
};
