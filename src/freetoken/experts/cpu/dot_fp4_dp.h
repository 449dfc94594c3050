// FP4 rows (MXFP4, NVFP4) on AVX512-BF16. The codes become bf16 weights by 16-bit table permutes (twice the e2m1
// values, small integers: exact in bf16), vdpbf16ps takes them against the operand's bf16 hi and lo halves
// (dot_tile_dp's split, ~16 mantissa bits), and the group scales multiply the partial sums once per block.
//
// Whole 128-code blocks (64 bytes, one load) decode with no widening: each 16-bit word holds four codes, and
// vpermw reads an index's low 5 bits, so with the table doubled over bit 4, the word, and the word shifted by 4,
// 8 and 12, index it directly: 4 permutes and 3 shifts give the codes 4j + m (j < 32) as vector m. The operand
// halves are stored in that order on this path (fp4_dp_pos, kernel_api.h), so vector m meets elements 4j + m.
// fp32 lane i of a block's dot products then sums elements 8i + m and 8i + 4 + m: group i / 4 (MXFP4, 32 codes)
// or i / 2 (NVFP4, 16), and one permute lays the block's scales over the lanes. Per 128 codes: 8 decode
// instructions, 8 dot products, 3 adds, a scale permute and one multiply-add; the 32-code form it replaces took
// 4 decode instructions, 2 dot products, a permute, a broadcast and a multiply-add per 32 codes.
// A row's codes past its last whole block (K % 128: 32, 64 or 96; natural operand order) take the 32-code form.
// Included by dot_impl.h inside its ISA namespace (FT_DOT_BF16 only), after FmtFP4.
//
// Every row keeps the same accumulators, operation order and reduction whether it runs alone (dot_tile_dp_fp4) or
// among R rows (dot_rows_dp_fp4), so a result has the same bits whatever the row blocking. K is a multiple of 32.
#pragma once
#include "dot_fp4_scales512.h"

// The doubled e2m1 values as bf16 bits, by code (0-7 positive, 8-15 their negatives), twice: entry i is code i & 15.
static inline __m512i fp4_bf16_table() {
  return _mm512_set_epi16(-16064, -16128, -16192, -16256, -16320, -16384, -16512, -32768,  // 0xC140 .. 0x8000
                          0x4140, 0x4100, 0x40C0, 0x4080, 0x4040, 0x4000, 0x3F80, 0,
                          -16064, -16128, -16192, -16256, -16320, -16384, -16512, -32768,
                          0x4140, 0x4100, 0x40C0, 0x4080, 0x4040, 0x4000, 0x3F80, 0);
}

// 64 bytes (128 codes, low nibble first) -> v[m], lane j = code 4j + m.
static inline void fp4_bf16x128(const uint8_t* p, __m512i table, __m512bh v[4]) {
  const __m512i w = _mm512_loadu_si512(p);
  v[0] = (__m512bh)_mm512_permutexvar_epi16(w, table);
  v[1] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4), table);
  v[2] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(w, 8), table);
  v[3] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(w, 12), table);
}

// A block's 16 unscaled partial sums against the operand halves at hi, lo (fp4_dp_pos order): four chains of two
// (a row alone is bound by their latency, not by the ports), summed pairwise.
static inline __m512 fp4_dp128(const __m512bh v[4], const uint16_t* hi, const uint16_t* lo) {
  __m512 c[4];
  for (int m = 0; m < 4; ++m) {
    c[m] = _mm512_dpbf16_ps(_mm512_setzero_ps(), v[m], (__m512bh)_mm512_loadu_si512(hi + 32 * m));
    c[m] = _mm512_dpbf16_ps(c[m], v[m], (__m512bh)_mm512_loadu_si512(lo + 32 * m));
  }
  return _mm512_add_ps(_mm512_add_ps(c[0], c[1]), _mm512_add_ps(c[2], c[3]));
}

// 16 bytes (32 codes) -> 32 bf16 weights in element order (the tail's form): byte j's two nibbles become 16-bit
// lanes 2j (low) and 2j + 1 (high) of its 32-bit lane, which index the table.
static inline __m512bh fp4_bf16x32(const uint8_t* p, __m512i table) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  // (b | b << 12) & 0x000F000F: the low nibble stays in bits 0-3, the high one lands in bits 16-19
  const __m512i idx = _mm512_ternarylogic_epi32(b, _mm512_slli_epi32(b, 12), _mm512_set1_epi32(0x000F000F), 0xA8);
  return (__m512bh)_mm512_permutexvar_epi16(idx, table);
}

// acc += scale * (w . hi[k:k+32] + w . lo[k:k+32]) for a tail block in element order.
static inline __m512 fp4_dp_block(int64_t k, __m512bh w, __m512 scale, const uint16_t* hi, const uint16_t* lo,
                                  __m512 acc) {
  __m512 p = _mm512_dpbf16_ps(_mm512_setzero_ps(), w, (__m512bh)_mm512_loadu_si512(hi + k));
  p = _mm512_dpbf16_ps(p, w, (__m512bh)_mm512_loadu_si512(lo + k));
  return _mm512_fmadd_ps(p, scale, acc);
}

// res[t] = row . x[t] for t < NT (hi / lo: the tokens' bf16 halves, fp4_dp_pos order); one accumulator a token.
template <bool NV, int NT>
static inline void dot_tile_dp_fp4(const Fp4Row& row, const uint16_t* const* hi, const uint16_t* const* lo, int64_t K,
                                   float* res) {
  using Sc = Fp4Scales<NV>;
  const __m512i table = fp4_bf16_table();
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += Sc::kSpan) {
    const __m512 sc = Sc::decode(row, k0, K);
    const int64_t k1 = imin(K, k0 + Sc::kSpan);
    int64_t k = k0;
    for (; k + 128 <= k1; k += 128) {
      __m512bh v[4];
      fp4_bf16x128(row.w + k / 2, table, v);
      const __m512 s = _mm512_permutexvar_ps(Sc::block_index(k - k0), sc);
      for (int t = 0; t < NT; ++t) acc[t] = _mm512_fmadd_ps(fp4_dp128(v, hi[t] + k, lo[t] + k), s, acc[t]);
    }
    for (; k < k1; k += 32) {
      const __m512bh w = fp4_bf16x32(row.w + k / 2, table);
      const __m512 s = Sc::tail_lanes(sc, k - k0);
      for (int t = 0; t < NT; ++t) acc[t] = fp4_dp_block(k, w, s, hi[t], lo[t], acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) res[t] = S::hsum(acc[t]);
}

// One token against R rows at once (dot_rows.h's batch-1 row blocking), each row as dot_tile_dp_fp4<NV, 1>.
template <bool NV, int R>
static inline void dot_rows_dp_fp4(const Fp4Row* rows, const uint16_t* hi, const uint16_t* lo, int64_t K,
                                   float* res) {
  using Sc = Fp4Scales<NV>;
  const __m512i table = fp4_bf16_table();
  __m512 acc[R], sc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += Sc::kSpan) {
    for (int r = 0; r < R; ++r) sc[r] = Sc::decode(rows[r], k0, K);
    const int64_t k1 = imin(K, k0 + Sc::kSpan);
    int64_t k = k0;
    for (; k + 128 <= k1; k += 128) {
      const __m512i idx = Sc::block_index(k - k0);
      for (int r = 0; r < R; ++r) {
        __m512bh v[4];
        fp4_bf16x128(rows[r].w + k / 2, table, v);
        acc[r] = _mm512_fmadd_ps(fp4_dp128(v, hi + k, lo + k), _mm512_permutexvar_ps(idx, sc[r]), acc[r]);
      }
    }
    for (; k < k1; k += 32) {
      for (int r = 0; r < R; ++r)
        acc[r] = fp4_dp_block(k, fp4_bf16x32(rows[r].w + k / 2, table), Sc::tail_lanes(sc[r], k - k0), hi, lo,
                              acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) res[r] = S::hsum(acc[r]);
}
