// The two phases of the expert kernel, written once over a SIMD traits struct `S` and a weight
// format `F`. Each ISA translation unit defines FT_ISA_NS and `struct S`, then includes this file,
// so every ISA gets its own copy of the templates in its own namespace (no ODR clash between TUs
// compiled with different -m flags; std templates are avoided for the same reason).
//
// S provides: vec, W (fp32 lanes), zero(), load(const float*), fma(a, b, c) = a * b + c, add,
// hsum(vec), sfma(float, float, float) for scalar tails, NT_MAX (tokens per register tile), and
// load_bf16x2(const uint16_t*, vec&, vec&) (2W bf16 -> two fp32 vectors).
// A weight format F provides: Row (a row handle), row(bank, index, K), load2(row, k, a, b) (2W
// weights starting at k as two fp32 vectors) and at(row, k) (one weight). fp8 / mxfp4 / nvfp4
// blocks plug in here: their Row carries the block scales and load2 dequantises one block.
#pragma once

#include "kernel_api.h"

namespace ft {
namespace FT_ISA_NS {

#ifndef FT_PREFETCH
#define FT_PREFETCH 512  // weights ahead of the loads (software prefetch, elements; 1 KiB of bf16)
#endif

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline float fmin_(float a, float b) { return a < b ? a : b; }
static inline float fmax_(float a, float b) { return a > b ? a : b; }

struct FmtF32 {
  using Row = const float*;
  static inline Row row(const void* bank, int64_t index, int64_t K) {
    return static_cast<const float*>(bank) + index * K;
  }
  static inline void load2(Row r, int64_t k, S::vec& a, S::vec& b) {
    a = S::load(r + k);
    b = S::load(r + k + S::W);
  }
  static inline float at(Row r, int64_t k) { return r[k]; }
  static inline void prefetch(Row r, int64_t k) {
    if (FT_PREFETCH > 0) __builtin_prefetch(r + k);
  }
};

struct FmtBF16 {
  using Row = const uint16_t*;
  static inline Row row(const void* bank, int64_t index, int64_t K) {
    return static_cast<const uint16_t*>(bank) + index * K;
  }
  static inline void load2(Row r, int64_t k, S::vec& a, S::vec& b) { S::load_bf16x2(r + k, a, b); }
  static inline float at(Row r, int64_t k) { return bf16_to_f32(r[k]); }
  static inline void prefetch(Row r, int64_t k) {
    if (FT_PREFETCH > 0) __builtin_prefetch(r + k);
  }
};

// res[r * NT + t] = dot(rows[r][0:K], xs[t][0:K]). Every (r, t) pair owns two accumulators and one
// scalar tail, reduced in a fixed order, so a value never depends on the tile shape (NR, NT) it was
// computed in: results do not depend on the thread count or on how routes were tiled.
template <class F, int NR, int NT>
static inline void dot_tile(const typename F::Row* rows, const float* const* xs, int64_t K, float* res) {
  constexpr int64_t B = 2 * S::W;
  S::vec acc0[NR][NT], acc1[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) acc0[r][t] = acc1[r][t] = S::zero();
  int64_t k = 0;
  for (; k + B <= K; k += B) {
    for (int r = 0; r < NR; ++r) {
      S::vec a, b;
      F::prefetch(rows[r], k + FT_PREFETCH);
      F::load2(rows[r], k, a, b);
      for (int t = 0; t < NT; ++t) {
        acc0[r][t] = S::fma(a, S::load(xs[t] + k), acc0[r][t]);
        acc1[r][t] = S::fma(b, S::load(xs[t] + k + S::W), acc1[r][t]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) {
      float s = 0.f;
      for (int64_t kk = k; kk < K; ++kk) s = S::sfma(F::at(rows[r], kk), xs[t][kk], s);
      res[r * NT + t] = S::hsum(S::add(acc0[r][t], acc1[r][t])) + s;
    }
}

#ifdef FT_DOT_BF16
// bf16 weights on AVX512-BF16: vdpbf16ps against the hi and lo bf16 halves of the fp32 operand
// (x ~= hi + lo keeps ~16 mantissa bits, close to the fp32 path). Same accumulator discipline.
template <int NR, int NT>
static inline void dot_tile_dp(const uint16_t* const* rows, const uint16_t* const* hi,
                               const uint16_t* const* lo, const float* const* xs, int64_t K, float* res) {
  constexpr int64_t B = 32;
  __m512 acc0[NR][NT], acc1[NR][NT];
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) acc0[r][t] = acc1[r][t] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + B <= K; k += B) {
    for (int r = 0; r < NR; ++r) {
      if (FT_PREFETCH > 0) __builtin_prefetch(rows[r] + k + FT_PREFETCH);
      __m512bh w = (__m512bh)_mm512_loadu_si512(rows[r] + k);
      for (int t = 0; t < NT; ++t) {
        acc0[r][t] = _mm512_dpbf16_ps(acc0[r][t], w, (__m512bh)_mm512_loadu_si512(hi[t] + k));
        acc1[r][t] = _mm512_dpbf16_ps(acc1[r][t], w, (__m512bh)_mm512_loadu_si512(lo[t] + k));
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) {
      float s = 0.f;
      for (int64_t kk = k; kk < K; ++kk) s = S::sfma(bf16_to_f32(rows[r][kk]), xs[t][kk], s);
      res[r * NT + t] = S::hsum(_mm512_add_ps(acc0[r][t], acc1[r][t])) + s;
    }
}
#endif

static inline float activate(int32_t act, float g, float u) {
  if (act == ACT_GPTOSS) {  // gpt-oss: clamped gate/up, glu = g * sigmoid(1.702 g), (u + 1) * glu
    g = fmin_(g, 7.f);
    u = fmax_(-7.f, fmin_(u, 7.f));
    return (u + 1.f) * (g / (1.f + __builtin_expf(-1.702f * g)));
  }
  return g / (1.f + __builtin_expf(-g)) * u;  // SiLU-gated
}

// Dispatches a runtime (nr, nt) to the template instance; nr in {1, 2}, nt in [1, S::NT_MAX].
template <class F, int NR>
static inline void dot_nt(const typename F::Row* rows, const float* const* xs, int64_t K, int nt, float* res) {
  switch (nt) {
    case 1: dot_tile<F, NR, 1>(rows, xs, K, res); break;
#if FT_NT_MAX >= 2
    case 2: dot_tile<F, NR, 2>(rows, xs, K, res); break;
#endif
#if FT_NT_MAX >= 4
    case 3: dot_tile<F, NR, 3>(rows, xs, K, res); break;
    case 4: dot_tile<F, NR, 4>(rows, xs, K, res); break;
#endif
    default: break;
  }
}

#ifdef FT_DOT_BF16
template <int NR>
static inline void dot_nt_dp(const uint16_t* const* rows, const uint16_t* const* hi, const uint16_t* const* lo,
                             const float* const* xs, int64_t K, int nt, float* res) {
  switch (nt) {
    case 1: dot_tile_dp<NR, 1>(rows, hi, lo, xs, K, res); break;
    case 2: dot_tile_dp<NR, 2>(rows, hi, lo, xs, K, res); break;
    case 3: dot_tile_dp<NR, 3>(rows, hi, lo, xs, K, res); break;
    case 4: dot_tile_dp<NR, 4>(rows, hi, lo, xs, K, res); break;
    default: break;
  }
}
#endif

// h[s, i] = act(gate_i . x[tok_s], up_i . x[tok_s]) for the units' (group, h block) pairs.
template <class F, bool DP>
static void phase1(const Plan& p, int64_t u0, int64_t u1) {
  const int64_t D = p.D, I = p.I;
  const int64_t nb = (I + p.hblock - 1) / p.hblock;
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t g = u / nb, i0 = (u % nb) * p.hblock, i1 = imin(I, i0 + p.hblock);
    const int64_t prow = p.group_row[g];
    const int64_t s1 = p.group_start[g + 1];
    for (int64_t s = p.group_start[g]; s < s1; s += FT_NT_MAX) {
      const int nt = static_cast<int>(imin(FT_NT_MAX, s1 - s));
      const float* xs[FT_NT_MAX];
      [[maybe_unused]] const uint16_t* xh[FT_NT_MAX];
      [[maybe_unused]] const uint16_t* xl[FT_NT_MAX];
      for (int t = 0; t < nt; ++t) {
        const int64_t off = static_cast<int64_t>(p.s_tok[s + t]) * D;
        xs[t] = p.x + off;
        if (DP) xh[t] = p.x_hi + off, xl[t] = p.x_lo + off;
      }
      for (int64_t i = i0; i < i1; ++i) {
        float res[2 * FT_NT_MAX];
        typename F::Row rows[2] = {F::row(p.gate_up, prow * 2 * I + i, D), F::row(p.gate_up, prow * 2 * I + I + i, D)};
#ifdef FT_DOT_BF16
        if (DP) {
          const uint16_t* br[2] = {reinterpret_cast<const uint16_t*>(rows[0]), reinterpret_cast<const uint16_t*>(rows[1])};
          dot_nt_dp<2>(br, xh, xl, xs, D, nt, res);
        } else
#endif
          dot_nt<F, 2>(rows, xs, D, nt, res);
        for (int t = 0; t < nt; ++t) {
          const float hv = activate(p.act, res[t], res[nt + t]);
          p.h[(s + t) * I + i] = hv;
          if (DP) {
            const uint16_t hi = f32_to_bf16(hv);
            p.h_hi[(s + t) * I + i] = hi;
            p.h_lo[(s + t) * I + i] = f32_to_bf16(hv - bf16_to_f32(hi));
          }
        }
      }
    }
  }
}

// out[t, d] for d in this thread's rows: zero, then += w_s * (down_d . h_s) over groups and routes in
// sorted order (a fixed order per output element, whatever the thread count).
template <class F, bool DP>
static void phase2(const Plan& p, int64_t b0, int64_t b1) {
  const int64_t D = p.D, I = p.I;
  const int64_t d0 = b0 * p.dblock, d1 = imin(D, b1 * p.dblock);
  if (d0 >= d1) return;
  for (int64_t t = 0; t < p.T; ++t)
    for (int64_t d = d0; d < d1; ++d) p.out[t * D + d] = 0.f;
  for (int64_t g = 0; g < p.G; ++g) {
    const int64_t prow = p.group_row[g];
    const int64_t s1 = p.group_start[g + 1];
    for (int64_t s = p.group_start[g]; s < s1; s += FT_NT_MAX) {
      const int nt = static_cast<int>(imin(FT_NT_MAX, s1 - s));
      const float* hs[FT_NT_MAX];
      [[maybe_unused]] const uint16_t* hh[FT_NT_MAX];
      [[maybe_unused]] const uint16_t* hl[FT_NT_MAX];
      for (int t = 0; t < nt; ++t) {
        hs[t] = p.h + (s + t) * I;
        if (DP) hh[t] = p.h_hi + (s + t) * I, hl[t] = p.h_lo + (s + t) * I;
      }
      for (int64_t d = d0; d < d1; d += 2) {
        const int nr = static_cast<int>(imin(2, d1 - d));
        float res[2 * FT_NT_MAX];
        typename F::Row rows[2] = {F::row(p.down, prow * D + d, I), F::row(p.down, prow * D + d + nr - 1, I)};
#ifdef FT_DOT_BF16
        if (DP) {
          const uint16_t* br[2] = {reinterpret_cast<const uint16_t*>(rows[0]), reinterpret_cast<const uint16_t*>(rows[1])};
          if (nr == 2) dot_nt_dp<2>(br, hh, hl, hs, I, nt, res);
          else dot_nt_dp<1>(br, hh, hl, hs, I, nt, res);
        } else
#endif
        if (nr == 2) dot_nt<F, 2>(rows, hs, I, nt, res);
        else dot_nt<F, 1>(rows, hs, I, nt, res);
        for (int r = 0; r < nr; ++r)
          for (int t = 0; t < nt; ++t) p.out[static_cast<int64_t>(p.s_tok[s + t]) * D + d + r] += p.s_w[s + t] * res[r * nt + t];
      }
    }
  }
}

static void phase1_dispatch(const Plan& p, int64_t u0, int64_t u1) {
#ifdef FT_DOT_BF16
  if (p.fmt == FMT_BF16 && p.x_hi) return phase1<FmtBF16, true>(p, u0, u1);
#endif
  if (p.fmt == FMT_BF16) return phase1<FmtBF16, false>(p, u0, u1);
  return phase1<FmtF32, false>(p, u0, u1);
}

static void phase2_dispatch(const Plan& p, int64_t b0, int64_t b1) {
#ifdef FT_DOT_BF16
  if (p.fmt == FMT_BF16 && p.h_hi) return phase2<FmtBF16, true>(p, b0, b1);
#endif
  if (p.fmt == FMT_BF16) return phase2<FmtBF16, false>(p, b0, b1);
  return phase2<FmtF32, false>(p, b0, b1);
}

}  // namespace FT_ISA_NS
}  // namespace ft
