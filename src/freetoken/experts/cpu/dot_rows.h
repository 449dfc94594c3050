// Batch-1 row blocking: one token against R weight rows at once, so each thread keeps R weight streams
// (R pages) in flight instead of one: more memory-level parallelism where a single stream per core
// leaves DRAM bandwidth unused. Included by dot_impl.h inside its ISA namespace (after dot_tile and
// dot_row); FT_ROWS_MAX (per ISA: what fits the register file) caps R. Plan::rows picks R at run time.
//
// Every row keeps exactly dot_tile<F, 1>'s (dot_tile_dp<1>'s) accumulators, operation order and
// reduction, so a result has the same bits whatever R (tests/test_cpu_kernel.py).
#pragma once

template <class F, int R>
static inline void dot_rows(const typename F::Row* rows, const float* x, int64_t K, float* res) {
  constexpr int64_t B = 2 * S::W;
  S::vec acc0[R], acc1[R], acc2[R], acc3[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = acc2[r] = acc3[r] = S::zero();
  int64_t k = 0;
  for (; k + 2 * B <= K; k += 2 * B) {
    const S::vec x0 = S::load(x + k), x1 = S::load(x + k + S::W);
    const S::vec x2 = S::load(x + k + B), x3 = S::load(x + k + B + S::W);
    for (int r = 0; r < R; ++r) {
      S::vec a, b, c, d;
      F::load2(rows[r], k, a, b);
      F::load2(rows[r], k + B, c, d);
      acc0[r] = S::fma(a, x0, acc0[r]);
      acc1[r] = S::fma(b, x1, acc1[r]);
      acc2[r] = S::fma(c, x2, acc2[r]);
      acc3[r] = S::fma(d, x3, acc3[r]);
    }
  }
  if (k + B <= K) {
    const S::vec x0 = S::load(x + k), x1 = S::load(x + k + S::W);
    for (int r = 0; r < R; ++r) {
      S::vec a, b;
      F::load2(rows[r], k, a, b);
      acc0[r] = S::fma(a, x0, acc0[r]);
      acc1[r] = S::fma(b, x1, acc1[r]);
    }
    k += B;
  }
  for (int r = 0; r < R; ++r) {
    float s = 0.f;
    for (int64_t kk = k; kk < K; ++kk) s = S::sfma(F::at(rows[r], kk), x[kk], s);
    res[r] = S::hsum(S::add(S::add(acc0[r], acc1[r]), S::add(acc2[r], acc3[r]))) + s;
  }
}

#ifdef FT_DOT_BF16
template <int R>
static inline void dot_rows_dp(const uint16_t* const* rows, const uint16_t* hi, const uint16_t* lo, const float* x,
                               int64_t K, float* res) {
  constexpr int64_t B = 32;
  __m512 acc0[R], acc1[R], acc2[R], acc3[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = acc2[r] = acc3[r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 2 * B <= K; k += 2 * B) {
    const __m512bh h0 = (__m512bh)_mm512_loadu_si512(hi + k), l0 = (__m512bh)_mm512_loadu_si512(lo + k);
    const __m512bh h1 = (__m512bh)_mm512_loadu_si512(hi + k + B), l1 = (__m512bh)_mm512_loadu_si512(lo + k + B);
    for (int r = 0; r < R; ++r) {
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(rows[r] + k);
      const __m512bh w1 = (__m512bh)_mm512_loadu_si512(rows[r] + k + B);
      acc0[r] = _mm512_dpbf16_ps(acc0[r], w0, h0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], w0, l0);
      acc2[r] = _mm512_dpbf16_ps(acc2[r], w1, h1);
      acc3[r] = _mm512_dpbf16_ps(acc3[r], w1, l1);
    }
  }
  if (k + B <= K) {
    const __m512bh h0 = (__m512bh)_mm512_loadu_si512(hi + k), l0 = (__m512bh)_mm512_loadu_si512(lo + k);
    for (int r = 0; r < R; ++r) {
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(rows[r] + k);
      acc0[r] = _mm512_dpbf16_ps(acc0[r], w0, h0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], w0, l0);
    }
    k += B;
  }
  for (int r = 0; r < R; ++r) {
    float s = 0.f;
    for (int64_t kk = k; kk < K; ++kk) s = S::sfma(bf16_to_f32(rows[r][kk]), x[kk], s);
    res[r] = S::hsum(_mm512_add_ps(_mm512_add_ps(acc0[r], acc1[r]), _mm512_add_ps(acc2[r], acc3[r]))) + s;
  }
}
#endif

// Rows first + r * stride (r < R) of `bank` (K weights per row) against the single token of `o`
// (o.nt == 1): res[r * stride].
template <class F, bool DP, int R>
static inline void dot_rows_at(const Bank& bank, int64_t first, int64_t stride, int64_t K, const Operands& o,
                               float* res) {
  typename F::Row rows[R];
  float out[R];
  for (int r = 0; r < R; ++r) rows[r] = F::row(bank, first + r * stride, K);
#ifdef FT_DOT_BF16
  if constexpr (DP && F::kFp4) {
    dot_rows_dp_fp4<F::kNV, R>(rows, o.hi[0], o.lo[0], K, out);
  } else if constexpr (DP) {
    const uint16_t* r16[R];
    for (int r = 0; r < R; ++r) r16[r] = reinterpret_cast<const uint16_t*>(rows[r]);
    dot_rows_dp<R>(r16, o.hi[0], o.lo[0], o.f[0], K, out);
  } else
#endif
#ifdef FT_FP4_Q16I
  if constexpr (F::kFp4) {
    dot_rows_fp4i<F::kNV, R>(rows, o.q[0], o.qs[0], K, out);
  } else
#endif
  {
    dot_rows<F, R>(rows, o.f[0], K, out);
  }
  for (int r = 0; r < R; ++r) res[r * stride] = out[r];
}

// n consecutive rows from `first` against a single token (o.nt == 1): res[i] for i < n. With R = `rows`
// (Plan::rows) streams where the ISA allows, the run is cut into R contiguous parts walked side by side
// (rows j, j + m, j + 2m, ... for m = n / R): each stream reads ascending addresses over its whole part, so
// the hardware prefetcher follows it across rows and pages. Rows shorter than a page (down's, I * 2 bytes)
// would otherwise put R short interleaved streams into one page, which the prefetcher does not follow
// (phase 2 then streamed far below phase 1: docs/benchmarks.md). The rest one by one.
template <class F, bool DP>
static inline void dot_row_run(const Bank& bank, int64_t first, int64_t n, int64_t K, const Operands& o, float* res,
                               int64_t rows) {
  int64_t i = 0;
  if constexpr (FT_ROWS_MAX >= 4) {
    if (rows >= 4 && n >= 4) {
      const int64_t m = n / 4;
      for (int64_t j = 0; j < m; ++j) dot_rows_at<F, DP, 4>(bank, first + j, m, K, o, res + j);
      i = 4 * m;
    }
  }
  if constexpr (FT_ROWS_MAX >= 2) {
    if (rows >= 2 && n - i >= 2) {
      const int64_t m = (n - i) / 2;
      for (int64_t j = 0; j < m; ++j) dot_rows_at<F, DP, 2>(bank, first + i + j, m, K, o, res + i + j);
      i += 2 * m;
    }
  }
  for (; i < n; ++i) dot_row<F, DP>(F::row(bank, first + i, K), o, K, res + i);
}
