// FP4 rows (MXFP4, NVFP4) on AVX-512 (F/BW), in integers: the operand arrives as int16 blocks of 32 with one fp32
// scale each (quantize_q16i, kernel_api.h: the AVX2 path's values, laid out for 128-code blocks), and a block's dot
// products are exact in int32. The decode needs no widening: each 16-bit word of a 64-byte load holds four codes, and
// vpshufb, which reads the low 4 bits of each index byte and zeroes a byte whose index has bit 7 set, takes the word
// with the code's nibble moved to its high byte and 0x80 in its low byte, so the word becomes 256 x the code's doubled
// e2m1 value as a signed int16. The four nibble positions m of the words give the codes 4j + m (j < 32) as vector m
// (vpermw's order on the AVX512-BF16 path, where vpermw is two port-5 uops on Intel cores), vpmaddwd multiplies them
// with the operand's vector m and adds pairs: int32 lane i then sums elements 8i .. 8i + 7, 256 x at most
// 8 * 12 * 32767 < 2^24 (exact in fp32). Per 128 codes: 3 shifts, 4 ternary-logic ops and 4 vpshufb (the port-5
// uops: the AVX2 path takes 16) for the decode, and per token 4 vpmaddwd, 3 adds, a conversion and a multiply-add by
// the lanes' group x block scales / 256. A row's codes past its last whole block (K % 128: 32, 64 or 96) take the AVX2
// path's 32-code form (dot_fp4_avx2.h, which this path includes: fp4_q16_pos's order there).
// Included by dot_impl.h inside the AVX-512 namespace (FT_FP4_Q16I), after dot_fp4_avx2.h.
//
// Every row keeps the same accumulators, operation order and reduction whether it runs alone (dot_tile_fp4i) or
// among R rows (dot_rows_fp4i), so a result has the same bits whatever the row blocking. K is a multiple of 32.
#pragma once
#include "dot_fp4_scales512.h"

// 64 bytes (128 codes, low nibble first) -> v[m], word j = 256 x the doubled e2m1 value of code 4j + m.
#if defined(FT_FP4_VBMI)
// AVX512-VBMI's vpermb reads an index byte's low 6 bits, and the table holds the 16 values 4 times over, so only the
// code's nibble counts: the word's high byte indexes it, zero-masking clears the low byte. Per 128 codes 3 shifts and
// 4 vpermb (7 uops; the vpshufb form below takes 11).
static inline void fp4_w16x128(const uint8_t* p, __m512i table, __m512i v[4]) {
  const __m512i w = _mm512_loadu_si512(p);
  const __mmask64 hi = 0xAAAAAAAAAAAAAAAAull;  // the words' high bytes
  v[0] = _mm512_maskz_permutexvar_epi8(hi, _mm512_slli_epi16(w, 8), table);
  v[1] = _mm512_maskz_permutexvar_epi8(hi, _mm512_slli_epi16(w, 4), table);
  v[2] = _mm512_maskz_permutexvar_epi8(hi, w, table);
  v[3] = _mm512_maskz_permutexvar_epi8(hi, _mm512_srli_epi16(w, 4), table);
}
#else
static inline void fp4_w16x128(const uint8_t* p, __m512i table, __m512i v[4]) {
  const __m512i w = _mm512_loadu_si512(p), nib = _mm512_set1_epi16(0x0F00), zero_lo = _mm512_set1_epi16(0x0080);
  // (a & nib) | zero_lo: the code's nibble in the high byte, a zeroing index in the low byte
  v[0] = _mm512_shuffle_epi8(table, _mm512_ternarylogic_epi32(_mm512_slli_epi16(w, 8), nib, zero_lo, 0xEA));
  v[1] = _mm512_shuffle_epi8(table, _mm512_ternarylogic_epi32(_mm512_slli_epi16(w, 4), nib, zero_lo, 0xEA));
  v[2] = _mm512_shuffle_epi8(table, _mm512_ternarylogic_epi32(w, nib, zero_lo, 0xEA));
  v[3] = _mm512_shuffle_epi8(table, _mm512_ternarylogic_epi32(_mm512_srli_epi16(w, 4), nib, zero_lo, 0xEA));
}
#endif

// A block's 16 lane sums (x 256) against the operand block q (quantize_q16i's order), as fp32 (exact).
#if defined(FT_FP4_VBMI)
// AVX512-VNNI's vpdpwssd multiplies and adds into int32 in one instruction: the same integer sums (exact, no
// saturation), 4 instructions where vpmaddwd and the adds take 7.
static inline __m512 fp4_q16i_dot128(const __m512i v[4], const int16_t* q) {
  __m512i a = _mm512_madd_epi16(v[0], _mm512_loadu_si512(q)), b = _mm512_madd_epi16(v[1], _mm512_loadu_si512(q + 32));
  a = _mm512_dpwssd_epi32(a, v[2], _mm512_loadu_si512(q + 64));
  b = _mm512_dpwssd_epi32(b, v[3], _mm512_loadu_si512(q + 96));
  return _mm512_cvtepi32_ps(_mm512_add_epi32(a, b));
}
#else
static inline __m512 fp4_q16i_dot128(const __m512i v[4], const int16_t* q) {
  __m512i s[4];
  for (int m = 0; m < 4; ++m) s[m] = _mm512_madd_epi16(v[m], _mm512_loadu_si512(q + 32 * m));
  return _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_add_epi32(s[0], s[1]), _mm512_add_epi32(s[2], s[3])));
}
#endif

// The operand's block scales over a 128-code block's lanes (lane i: block i / 4 of the four at qs), / 256.
static inline __m512 fp4_q16i_lane_scales(const float* qs) {
  const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return _mm512_mul_ps(_mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_loadu_ps(qs))),
                       _mm512_set1_ps(1.f / 256.f));
}

// res[t] = row . x[t] for t < NT (q / qs: the tokens' int16 blocks and their scales): each block decoded once.
template <bool NV, int NT>
static inline void dot_tile_fp4i(const Fp4Row& row, const int16_t* const* q, const float* const* qs, int64_t K,
                                 float* res) {
  using Sc = Fp4Scales<NV>;
  const __m512i table = _mm512_broadcast_i32x4(fp4_i8_table());
  const int64_t kw = K & ~int64_t{127};
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < kw; k0 += Sc::kSpan) {
    const __m512 sc = Sc::decode(row, k0, K);
    for (int64_t k = k0; k < imin(kw, k0 + Sc::kSpan); k += 128) {
      __m512i v[4];
      fp4_w16x128(row.w + k / 2, table, v);
      const __m512 g = _mm512_permutexvar_ps(Sc::block_index(k - k0), sc);
      for (int t = 0; t < NT; ++t)
        acc[t] = _mm512_fmadd_ps(fp4_q16i_dot128(v, q[t] + k), _mm512_mul_ps(g, fp4_q16i_lane_scales(qs[t] + k / 32)),
                                 acc[t]);
    }
  }
  __m256 tail[NT];
  for (int t = 0; t < NT; ++t) tail[t] = _mm256_setzero_ps();
  for (int64_t k = kw; k < K; k += 32) {
    const Fp4Q16Codes c = fp4_q16_codes(row.w + k / 2, _mm512_castsi512_si128(table));
    const __m256 g = fp4_q16_scales<NV>(row, k);
    for (int t = 0; t < NT; ++t)
      tail[t] = _mm256_fmadd_ps(fp4_q16_dot(c, q[t] + k), _mm256_mul_ps(g, _mm256_broadcast_ss(qs[t] + k / 32)), tail[t]);
  }
  for (int t = 0; t < NT; ++t) res[t] = S::hsum(acc[t]) + fp4_hsum256(tail[t]);
}

// One token against R rows at once (dot_rows.h's batch-1 row blocking), each row as dot_tile_fp4i<NV, 1>.
template <bool NV, int R>
static inline void dot_rows_fp4i(const Fp4Row* rows, const int16_t* q, const float* qs, int64_t K, float* res) {
  using Sc = Fp4Scales<NV>;
  const __m512i table = _mm512_broadcast_i32x4(fp4_i8_table());
  const int64_t kw = K & ~int64_t{127};
  __m512 acc[R], sc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < kw; k0 += Sc::kSpan) {
    for (int r = 0; r < R; ++r) sc[r] = Sc::decode(rows[r], k0, K);
    for (int64_t k = k0; k < imin(kw, k0 + Sc::kSpan); k += 128) {
      const __m512i idx = Sc::block_index(k - k0);
      const __m512 s = fp4_q16i_lane_scales(qs + k / 32);
      for (int r = 0; r < R; ++r) {
        __m512i v[4];
        fp4_w16x128(rows[r].w + k / 2, table, v);
        acc[r] = _mm512_fmadd_ps(fp4_q16i_dot128(v, q + k), _mm512_mul_ps(_mm512_permutexvar_ps(idx, sc[r]), s),
                                 acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    __m256 tail = _mm256_setzero_ps();
    for (int64_t k = kw; k < K; k += 32)
      tail = _mm256_fmadd_ps(fp4_q16_dot(fp4_q16_codes(rows[r].w + k / 2, _mm512_castsi512_si128(table)), q + k),
                             _mm256_mul_ps(fp4_q16_scales<NV>(rows[r], k), _mm256_broadcast_ss(qs + k / 32)), tail);
    res[r] = S::hsum(acc[r]) + fp4_hsum256(tail);
  }
}
