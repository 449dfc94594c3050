// FP4 rows (MXFP4, NVFP4) on AVX2: each group's 16 or 32 codes are dotted unscaled, and the group's scale
// multiplies that partial sum once (as on the AVX512-BF16 path, dot_fp4_dp.h), where FmtFP4::load2 scales every
// decoded vector. 8 codes (4 bytes, broadcast by the load) decode in 4 instructions: a variable shift brings code m
// to lane m's low bits, vpermps looks its low 3 bits up in a table of the doubled e2m1 magnitudes, and one xor with
// the code shifted to the top flips the sign from bit 3. The table entries are stored xor'd with their own index at
// bits 28-30, so that xor cancels the magnitude bits it also carries: 4 instructions and one FMA per 8 codes, plus
// a scale lookup, a broadcast and an FMA per group. Included by dot_impl.h inside the AVX2 namespace
// (FT_FP4_GROUPS), after FmtFP4.
//
// Every row keeps the same accumulators, operation order and reduction whether it runs alone (dot_tile_fp4) or
// among R rows (dot_rows_fp4), so a result has the same bits whatever the row blocking. K is a multiple of 32.
#pragma once

// 2 * e2m1 magnitude i as fp32 bits, xor i << 28 (fp4_w8 undoes it).
static inline __m256 fp4_avx2_table() {
  return _mm256_castsi256_ps(_mm256_setr_epi32(0, 0x3F800000 ^ (1 << 28), 0x40000000 ^ (2 << 28),
                                               0x40400000 ^ (3 << 28), 0x40800000 ^ (4 << 28),
                                               0x40C00000 ^ (5 << 28), 0x41000000 ^ (6 << 28),
                                               0x41400000 ^ (7 << 28)));
}

// Codes [k, k + 8) of the packed row p (k even) as 8 fp32 weights, twice their e2m1 values.
static inline __m256 fp4_w8(const uint8_t* p, int64_t k, __m256 table) {
  uint32_t u;
  __builtin_memcpy(&u, p + k / 2, 4);
  const __m256i c = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(u)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
  return _mm256_xor_ps(_mm256_permutevar8x32_ps(table, c), _mm256_castsi256_ps(_mm256_slli_epi32(c, 28)));
}

// res[t] = row . xs[t] for t < NT: per group, two unscaled FMA chains (alternate 8 codes), their sum times the
// group's scale added by one FMA.
template <bool NV, int NT>
static inline void dot_tile_fp4(const Fp4Row& row, const float* const* xs, int64_t K, float* res) {
  using F = FmtFP4<NV>;
  const __m256 table = fp4_avx2_table();
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += F::G) {
    __m256 pa[NT], pb[NT];
    for (int t = 0; t < NT; ++t) pa[t] = pb[t] = _mm256_setzero_ps();
    for (int64_t kk = k; kk < k + F::G; kk += 16) {
      const __m256 wa = fp4_w8(row.w, kk, table), wb = fp4_w8(row.w, kk + 8, table);
      for (int t = 0; t < NT; ++t) {
        pa[t] = _mm256_fmadd_ps(wa, _mm256_loadu_ps(xs[t] + kk), pa[t]);
        pb[t] = _mm256_fmadd_ps(wb, _mm256_loadu_ps(xs[t] + kk + 8), pb[t]);
      }
    }
    const __m256 s = _mm256_set1_ps(F::scale(row, k));
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_fmadd_ps(_mm256_add_ps(pa[t], pb[t]), s, acc[t]);
  }
  for (int t = 0; t < NT; ++t) res[t] = S::hsum(acc[t]);
}

// One token against R rows at once (dot_rows.h's batch-1 row blocking), each row as dot_tile_fp4<NV, 1>.
template <bool NV, int R>
static inline void dot_rows_fp4(const Fp4Row* rows, const float* x, int64_t K, float* res) {
  using F = FmtFP4<NV>;
  const __m256 table = fp4_avx2_table();
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += F::G) {
    __m256 pa[R], pb[R];
    for (int r = 0; r < R; ++r) pa[r] = pb[r] = _mm256_setzero_ps();
    for (int64_t kk = k; kk < k + F::G; kk += 16) {
      const __m256 xa = _mm256_loadu_ps(x + kk), xb = _mm256_loadu_ps(x + kk + 8);
      for (int r = 0; r < R; ++r) {
        pa[r] = _mm256_fmadd_ps(fp4_w8(rows[r].w, kk, table), xa, pa[r]);
        pb[r] = _mm256_fmadd_ps(fp4_w8(rows[r].w, kk + 8, table), xb, pb[r]);
      }
    }
    for (int r = 0; r < R; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_add_ps(pa[r], pb[r]), _mm256_set1_ps(F::scale(rows[r], k)), acc[r]);
  }
  for (int r = 0; r < R; ++r) res[r] = S::hsum(acc[r]);
}
