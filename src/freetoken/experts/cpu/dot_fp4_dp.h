// FP4 rows (MXFP4, NVFP4) on AVX512-BF16: 32 e2m1 codes become 32 bf16 weights by one 16-bit table permute
// (twice the e2m1 values, small integers: exact in bf16), vdpbf16ps takes them against the operand's bf16 hi and
// lo halves (dot_tile_dp's split, ~16 mantissa bits), and the 32 codes' group scales multiply the 16 partial sums
// once (MXFP4: one scale per 32 codes; NVFP4: lanes 0-7 hold codes 0-15, lanes 8-15 codes 16-31, one scale each).
// Against the fp32 path (dot_tile with FmtFP4) this is 4 decode instructions and one scale multiply per 32 codes
// instead of 11 and two. Included by dot_impl.h inside its ISA namespace (FT_DOT_BF16 only), after FmtFP4.
//
// Every row keeps the same accumulators, operation order and reduction whether it runs alone (dot_tile_dp_fp4) or
// among R rows (dot_rows_dp_fp4), so a result has the same bits whatever the row blocking. K is a multiple of 32.
#pragma once

// The doubled e2m1 values as bf16 bits, by code (0-7 positive, 8-15 their negatives); the upper 16 entries unused.
static inline __m512i fp4_bf16_table() {
  return _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                          -16064, -16128, -16192, -16256, -16320, -16384, -16512, -32768,  // 0xC140 .. 0x8000
                          0x4140, 0x4100, 0x40C0, 0x4080, 0x4040, 0x4000, 0x3F80, 0);
}

// 16 bytes of e2m1 nibbles (32 codes, low nibble first) -> 32 bf16 weights in element order: byte j's two nibbles
// become 16-bit lanes 2j (low) and 2j + 1 (high) of its 32-bit lane, which index the table.
static inline __m512bh fp4_bf16x32(const uint8_t* p, __m512i table) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  // (b | b << 12) & 0x000F000F: the low nibble stays in bits 0-3, the high one lands in bits 16-19
  const __m512i idx = _mm512_ternarylogic_epi32(b, _mm512_slli_epi32(b, 12), _mm512_set1_epi32(0x000F000F), 0xA8);
  return (__m512bh)_mm512_permutexvar_epi16(idx, table);
}

// The scales of codes [k, k + 32) of a row, per vdpbf16ps lane (FmtFP4's own scale: the reference's rounding).
template <bool NV>
static inline __m512 fp4_lane_scales(const Fp4Row& r, int64_t k) {
  if constexpr (NV) {
    return _mm512_mask_mov_ps(_mm512_set1_ps(FmtFP4<true>::scale(r, k)), 0xFF00,
                              _mm512_set1_ps(FmtFP4<true>::scale(r, k + 16)));
  } else {
    return _mm512_set1_ps(FmtFP4<false>::scale(r, k));
  }
}

// acc += scales(k) * (w . hi[k:k+32] + w . lo[k:k+32]), w the row's codes [k, k + 32).
template <bool NV>
static inline __m512 fp4_dp_block(const Fp4Row& r, int64_t k, __m512bh w, const uint16_t* hi, const uint16_t* lo,
                                  __m512 acc) {
  __m512 p = _mm512_dpbf16_ps(_mm512_setzero_ps(), w, (__m512bh)_mm512_loadu_si512(hi + k));
  p = _mm512_dpbf16_ps(p, w, (__m512bh)_mm512_loadu_si512(lo + k));
  return _mm512_fmadd_ps(p, fp4_lane_scales<NV>(r, k), acc);
}

// res[t] = row . x[t] for t < NT (hi / lo: the tokens' bf16 halves); two accumulators, blocks alternating.
template <bool NV, int NT>
static inline void dot_tile_dp_fp4(const Fp4Row& row, const uint16_t* const* hi, const uint16_t* const* lo, int64_t K,
                                   float* res) {
  const __m512i table = fp4_bf16_table();
  __m512 acc0[NT], acc1[NT];
  for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    const __m512bh w0 = fp4_bf16x32(row.w + k / 2, table), w1 = fp4_bf16x32(row.w + k / 2 + 16, table);
    for (int t = 0; t < NT; ++t) {
      acc0[t] = fp4_dp_block<NV>(row, k, w0, hi[t], lo[t], acc0[t]);
      acc1[t] = fp4_dp_block<NV>(row, k + 32, w1, hi[t], lo[t], acc1[t]);
    }
  }
  if (k < K) {
    const __m512bh w0 = fp4_bf16x32(row.w + k / 2, table);
    for (int t = 0; t < NT; ++t) acc0[t] = fp4_dp_block<NV>(row, k, w0, hi[t], lo[t], acc0[t]);
  }
  for (int t = 0; t < NT; ++t) res[t] = S::hsum(_mm512_add_ps(acc0[t], acc1[t]));
}

// One token against R rows at once (dot_rows.h's batch-1 row blocking), each row as dot_tile_dp_fp4<NV, 1>.
template <bool NV, int R>
static inline void dot_rows_dp_fp4(const Fp4Row* rows, const uint16_t* hi, const uint16_t* lo, int64_t K,
                                   float* res) {
  const __m512i table = fp4_bf16_table();
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    for (int r = 0; r < R; ++r) {
      const __m512bh w0 = fp4_bf16x32(rows[r].w + k / 2, table), w1 = fp4_bf16x32(rows[r].w + k / 2 + 16, table);
      acc0[r] = fp4_dp_block<NV>(rows[r], k, w0, hi, lo, acc0[r]);
      acc1[r] = fp4_dp_block<NV>(rows[r], k + 32, w1, hi, lo, acc1[r]);
    }
  }
  if (k < K) {
    for (int r = 0; r < R; ++r)
      acc0[r] = fp4_dp_block<NV>(rows[r], k, fp4_bf16x32(rows[r].w + k / 2, table), hi, lo, acc0[r]);
  }
  for (int r = 0; r < R; ++r) res[r] = S::hsum(_mm512_add_ps(acc0[r], acc1[r]));
}
