// FP4 rows (MXFP4, NVFP4) in integers, 32 codes at a time: the rows' tails past their last whole 128-code block on the
// AVX2 and AVX-512 paths (dot_fp4_avx2i.h, dot_fp4_avx512.h), against the operand's int16 blocks of 32 with one fp32
// scale each (quantize_q16i, kernel_api.h, which lays a tail block's even elements first, then its odd ones:
// fp4_q16_pos; |error| <= half the block's max / 32767, measured 3-6e-5 of the output's max). A 32-code block's dot
// product is exact in int32: the nibbles index a 16-entry int8 table of the doubled e2m1 values (vpshufb: the low
// nibbles give the even codes, the high ones the odd codes), vpmovsxbw widens them, and vpmaddwd multiplies and adds
// pairs (|sum| <= 32 * 12 * 32767 < 2^24: exact as fp32 too). int32 lane j then holds codes 4j, 4j + 2 (even) plus
// 4j + 1, 4j + 3 (odd): MXFP4's one group, or NVFP4's first group in lanes 0-3 and its second in lanes 4-7; one FMA
// by (group scale x block scale) per block. Included by dot_impl.h inside the AVX2 and AVX-512 namespaces
// (FT_FP4_Q16), after FmtFP4; 256-bit throughout.
#pragma once

// A fixed-order sum of 8 lanes (the AVX-512 TU's S works on 16).
static inline float fp4_hsum256(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Twice the e2m1 values by code, as int8.
static inline __m128i fp4_i8_table() { return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12); }

// The 32 codes at w as int16: the even codes, then the odd ones (fp4_q16_pos order).
struct Fp4Q16Codes {
  __m256i even, odd;
};
static inline Fp4Q16Codes fp4_q16_codes(const uint8_t* w, __m128i table) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w)), m = _mm_set1_epi8(0x0F);
  return {_mm256_cvtepi8_epi16(_mm_shuffle_epi8(table, _mm_and_si128(b, m))),
          _mm256_cvtepi8_epi16(_mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(b, 4), m)))};
}

// The exact int32 sums of a block's codes against the int16 block q, as 8 fp32 lanes.
static inline __m256 fp4_q16_dot(const Fp4Q16Codes& c, const int16_t* q) {
  const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(c.even, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))),
                                     _mm256_madd_epi16(c.odd, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16))));
  return _mm256_cvtepi32_ps(p);
}

// The lanes' group scales of the row's block at k (NVFP4: lanes 0-3 the block's first group, 4-7 its second);
// times an operand block's scale, they scale that block's sums. Broadcast from the tables in memory (load ports),
// not from registers (the shuffle port the decode's vpshufb / vpmovsxbw need): MXFP4 1.1-1.2x, NVFP4 1.2x the dot
// products alone (dev box, bench/fp4_dot.cpp, 3 alternating runs).
template <bool NV>
static inline __m256 fp4_q16_scales(const Fp4Row& row, int64_t k) {
  if constexpr (NV) {  // e4m3 * mult rounded once (as FmtFP4::scale), then the exact halving
    const __m256 e = _mm256_blend_ps(_mm256_castps128_ps256(_mm_broadcast_ss(&kFp4Scales.e4m3[row.s[k / 16]])),
                                     _mm256_broadcast_ss(&kFp4Scales.e4m3[row.s[k / 16 + 1]]), 0xF0);
    return _mm256_mul_ps(e, _mm256_set1_ps(row.mult * 0.5f));  // * 0.5 commutes with the rounding
  }
  return _mm256_broadcast_ss(&kFp4Scales.e8m0_half[row.s[k / 32]]);
}
