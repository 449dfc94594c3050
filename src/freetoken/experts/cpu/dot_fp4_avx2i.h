// FP4 rows (MXFP4, NVFP4) on AVX2, in integers, on quantize_q16i's operand order (kernel_api.h): dot_fp4_avx512.h's
// high-byte decode in 256-bit halves. A 32-byte load holds 64 codes; in each 16-bit word, the code's nibble moved to
// the high byte and a low byte of 0 make vpshufb give 256 x the code's doubled e2m1 value as a signed int16 (index 0
// reads the table's entry for code 0, e2m1's +0, so the low byte needs no zeroing index), so the four nibble
// positions m give codes 4j + m (j < 16) as vector m with no widening. Against a 128-code operand block, whose vector m holds elements 4j + m at 32m + j (j < 32), the
// block's first 64 codes meet words 0-15 of each vector m and its last 64 words 16-31; vpmaddwd and three adds leave
// int32 lane i of a half with that half's elements 8i .. 8i + 7, 256 x at most 8 * 12 * 32767 < 2^24 (exact as
// fp32). Per 64 codes: 3 shifts, 4 ands and 4 vpshufb for the decode (the 32-code form of dot_fp4_avx2.h takes
// 4 vpshufb and 4 vpmovsxbw, the shuffle port's), then per token 4 vpmaddwd, 3 adds, a conversion and a multiply-add
// by the lanes' group x block scales / 256. A row's codes past its last whole 128-code block take the 32-code form
// (fp4_q16_pos's order, as quantize_q16i lays them). Included by dot_impl.h inside the AVX2 namespace (FT_FP4_Q16I
// with FT_FP4_Q16I_256), after dot_fp4_avx2.h; its functions have dot_fp4_avx512.h's names and contracts.
//
// Every row keeps the same accumulators, operation order and reduction whether it runs alone (dot_tile_fp4i) or
// among R rows (dot_rows_fp4i), so a result has the same bits whatever the row blocking. K is a multiple of 32.
#pragma once

// 32 bytes (64 codes, low nibble first) -> v[m], word j = 256 x the doubled e2m1 value of code 4j + m.
static inline void fp4_w16x64(const uint8_t* p, __m256i table, __m256i v[4]) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i nib = _mm256_set1_epi16(0x0F00);  // the low byte left 0 indexes table[0], e2m1's +0
  v[0] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_slli_epi16(w, 8), nib));
  v[1] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_slli_epi16(w, 4), nib));
  v[2] = _mm256_shuffle_epi8(table, _mm256_and_si256(w, nib));
  v[3] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(w, 4), nib));
}

// Half h of a 128-code block: its 8 lane sums (x 256) against the operand block q (quantize_q16i's order), as fp32.
#if defined(FT_FP4_AVXVNNI)
// AVX-VNNI's vpdpwssd (VEX) multiplies and adds into int32 in one instruction: the same integer sums (exact, no
// saturation), 5 instructions where vpmaddwd and the adds take 7.
static inline __m256 fp4_q16i_dot64(const __m256i v[4], const int16_t* q, int h) {
  const auto op = [&](int m) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * m + 16 * h)); };
  const __m256i a = _mm256_dpwssd_avx_epi32(_mm256_madd_epi16(v[0], op(0)), v[2], op(2));
  const __m256i b = _mm256_dpwssd_avx_epi32(_mm256_madd_epi16(v[1], op(1)), v[3], op(3));
  return _mm256_cvtepi32_ps(_mm256_add_epi32(a, b));
}
#else
static inline __m256 fp4_q16i_dot64(const __m256i v[4], const int16_t* q, int h) {
  __m256i s[4];
  for (int m = 0; m < 4; ++m)
    s[m] = _mm256_madd_epi16(v[m], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * m + 16 * h)));
  return _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3])));
}
#endif

// The operand's block scales over half h's lanes (lanes 0-3 the half's first block of 32, lanes 4-7 its second).
static inline __m256 fp4_q16i_half_scales(const float* qs, int h) {
  return _mm256_blend_ps(_mm256_broadcast_ss(qs + 2 * h), _mm256_broadcast_ss(qs + 2 * h + 1), 0xF0);
}

// The row's group scales / 256 over the lanes of the 128-code block at k, half 0 in g[0] and half 1 in g[1]
// (MXFP4: lanes 0-3 and 4-7 of a half take one group each; NVFP4: lanes 2i, 2i + 1 take the half's group i).
// FmtFP4's values bit for bit, then the exact / 256 of the decode's x 256.
template <bool NV>
static inline void fp4_q16i_group_scales(const Fp4Row& row, int64_t k, __m256 g[2]) {
  if constexpr (NV) {  // e4m3 -> fp16 (values / 256, exact: dot_fp4_scales512.h's trick) -> fp32, then * mult / 2
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row.s + k / 16));
    const __m128i f16 = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7), _mm_set1_epi16(static_cast<short>(0xBFFF)));
    const __m256 e = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(f16), _mm256_set1_ps(row.mult * 128.f)),
                                   _mm256_set1_ps(1.f / 256.f));
    g[0] = _mm256_permutevar8x32_ps(e, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    g[1] = _mm256_permutevar8x32_ps(e, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
  } else {
    const uint8_t* s = row.s + k / 32;
    const __m256 inv = _mm256_set1_ps(1.f / 256.f);
    for (int h = 0; h < 2; ++h)
      g[h] = _mm256_mul_ps(_mm256_blend_ps(_mm256_broadcast_ss(&kFp4Scales.e8m0_half[s[2 * h]]),
                                           _mm256_broadcast_ss(&kFp4Scales.e8m0_half[s[2 * h + 1]]), 0xF0),
                           inv);
  }
}

// res[t] = row . x[t] for t < NT (q / qs: the tokens' int16 blocks and their scales): each block decoded once.
template <bool NV, int NT>
static inline void dot_tile_fp4i(const Fp4Row& row, const int16_t* const* q, const float* const* qs, int64_t K,
                                 float* res) {
  const __m256i table = _mm256_broadcastsi128_si256(fp4_i8_table());
  const int64_t kw = K & ~int64_t{127};
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kw; k += 128) {
    __m256 g[2];
    fp4_q16i_group_scales<NV>(row, k, g);
    for (int h = 0; h < 2; ++h) {
      __m256i v[4];
      fp4_w16x64(row.w + k / 2 + 32 * h, table, v);
      for (int t = 0; t < NT; ++t)
        acc[t] = _mm256_fmadd_ps(fp4_q16i_dot64(v, q[t] + k, h),
                                 _mm256_mul_ps(g[h], fp4_q16i_half_scales(qs[t] + k / 32, h)), acc[t]);
    }
  }
  for (int64_t k = kw; k < K; k += 32) {
    const Fp4Q16Codes c = fp4_q16_codes(row.w + k / 2, fp4_i8_table());
    const __m256 g = fp4_q16_scales<NV>(row, k);
    for (int t = 0; t < NT; ++t)
      acc[t] = _mm256_fmadd_ps(fp4_q16_dot(c, q[t] + k), _mm256_mul_ps(g, _mm256_broadcast_ss(qs[t] + k / 32)), acc[t]);
  }
  for (int t = 0; t < NT; ++t) res[t] = fp4_hsum256(acc[t]);
}

// One token against R rows at once (dot_rows.h's batch-1 row blocking), each row as dot_tile_fp4i<NV, 1>.
template <bool NV, int R>
static inline void dot_rows_fp4i(const Fp4Row* rows, const int16_t* q, const float* qs, int64_t K, float* res) {
  const __m256i table = _mm256_broadcastsi128_si256(fp4_i8_table());
  const int64_t kw = K & ~int64_t{127};
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kw; k += 128) {
    const __m256 s[2] = {fp4_q16i_half_scales(qs + k / 32, 0), fp4_q16i_half_scales(qs + k / 32, 1)};
    for (int r = 0; r < R; ++r) {
      __m256 g[2];
      fp4_q16i_group_scales<NV>(rows[r], k, g);
      for (int h = 0; h < 2; ++h) {
        __m256i v[4];
        fp4_w16x64(rows[r].w + k / 2 + 32 * h, table, v);
        acc[r] = _mm256_fmadd_ps(fp4_q16i_dot64(v, q + k, h), _mm256_mul_ps(g[h], s[h]), acc[r]);
      }
    }
  }
  for (int64_t k = kw; k < K; k += 32) {
    const __m256 s = _mm256_broadcast_ss(qs + k / 32);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(fp4_q16_dot(fp4_q16_codes(rows[r].w + k / 2, fp4_i8_table()), q + k),
                               _mm256_mul_ps(fp4_q16_scales<NV>(rows[r], k), s), acc[r]);
  }
  for (int r = 0; r < R; ++r) res[r] = fp4_hsum256(acc[r]);
}
