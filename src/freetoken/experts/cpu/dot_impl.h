// The three phases of the expert kernel, written once over a SIMD traits struct `S` and a weight
// format `F`. Each ISA translation unit defines FT_ISA_NS, FT_NT_MAX (tokens per register tile) and
// `struct S`, then includes this file, so every ISA gets its own copy of the templates in its own
// namespace (no ODR clash between TUs compiled with different -m flags; std templates are avoided
// for the same reason).
//
// S provides: vec, W (fp32 lanes), zero(), load(const float*), fma(a, b, c) = a * b + c, add,
// hsum(vec) (fixed order), sfma(float, float, float) for scalar tails, and
// load_bf16x2(const uint16_t*, vec&, vec&) (2W bf16 -> two fp32 vectors) and
// load_fp8x2(const uint8_t*, vec&, vec&) (2W e4m3 -> two fp32 vectors of the values / 256, exactly).
// A weight format F provides: Row (a row handle), row(bank, index, K) (row `index` of a bank of rows of
// K weights), load2(row, k, a, b) (2W weights starting at k as two fp32 vectors) and at(row, k) (one
// weight), and kScaled: whether the operands of a run of rows are scaled first (scaled_operands below).
// Block-scaled formats decode in load2, in registers, and move the block scale onto the operand: every row of a
// phase unit lies in one block row, so x (or h) times that row's scales, once per unit, makes every weight's scale
// multiply go away. FP4 formats (FmtFP4) cannot: their scales change along a row and from row to row. AVX512-BF16
// (dot_fp4_dp.h: bf16 codes against the operand's hi/lo halves), AVX2 (dot_fp4_avx2i.h: codes decoded to the high
// bytes of int16 words against the operand as int16 blocks; dot_fp4_avx2.h's 32-code form for the rows' tails) and
// AVX-512 (dot_fp4_avx512.h: the same in 512-bit words) have FP4 kernels of their own that dot a block unscaled and
// scale the partial sums; elsewhere load2 decodes 2W e2m1 codes through a 16-entry table shuffle (S::load_e2m1x2: twice the values, small
// integers, exact) and multiplies each W-half by its group's scale (S::mul, S::set1).
#pragma once

#include "kernel_api.h"

namespace ft {
namespace FT_ISA_NS {

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline float fmin_(float a, float b) { return a < b ? a : b; }
static inline float fmax_(float a, float b) { return a > b ? a : b; }

#include "dot_formats.h"
#ifdef FT_DOT_BF16
#include "dot_fp4_dp.h"
#endif
#ifdef FT_FP4_Q16
#include "dot_fp4_avx2.h"
#endif
#if defined(FT_FP4_Q16I_256)
#include "dot_fp4_avx2i.h"
#elif defined(FT_FP4_Q16I)
#include "dot_fp4_avx512.h"
#endif

// res[t] = dot(row[0:K], xs[t][0:K]) for t < NT. Every token owns two accumulators and one scalar
// tail, reduced in a fixed order, so a value never depends on the tile (NT) it was computed in:
// results do not depend on the thread count or on how routes were tiled.
template <class F, int NT>
static inline void dot_tile(typename F::Row row, const float* const* xs, int64_t K, float* res) {
  constexpr int64_t B = 2 * S::W;
  // four independent FMA chains per token (two 2W-blocks per iteration): one chain per block half
  // would be bound by the FMA latency rather than by memory
  S::vec acc0[NT], acc1[NT], acc2[NT], acc3[NT];
  for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = acc2[t] = acc3[t] = S::zero();
  int64_t k = 0;
  for (; k + 2 * B <= K; k += 2 * B) {
    S::vec a, b, c, d;
    F::load2(row, k, a, b);
    F::load2(row, k + B, c, d);
    for (int t = 0; t < NT; ++t) {
      acc0[t] = S::fma(a, S::load(xs[t] + k), acc0[t]);
      acc1[t] = S::fma(b, S::load(xs[t] + k + S::W), acc1[t]);
      acc2[t] = S::fma(c, S::load(xs[t] + k + B), acc2[t]);
      acc3[t] = S::fma(d, S::load(xs[t] + k + B + S::W), acc3[t]);
    }
  }
  if (k + B <= K) {
    S::vec a, b;
    F::load2(row, k, a, b);
    for (int t = 0; t < NT; ++t) {
      acc0[t] = S::fma(a, S::load(xs[t] + k), acc0[t]);
      acc1[t] = S::fma(b, S::load(xs[t] + k + S::W), acc1[t]);
    }
    k += B;
  }
  for (int t = 0; t < NT; ++t) {
    float s = 0.f;
    for (int64_t kk = k; kk < K; ++kk) s = S::sfma(F::at(row, kk), xs[t][kk], s);
    res[t] = S::hsum(S::add(S::add(acc0[t], acc1[t]), S::add(acc2[t], acc3[t]))) + s;
  }
}

#ifdef FT_DOT_BF16
// bf16 weights on AVX512-BF16: vdpbf16ps against the hi and lo bf16 halves of the fp32 operand
// (x ~= hi + lo keeps ~16 mantissa bits, close to the fp32 path). Same accumulator discipline.
template <int NT>
static inline void dot_tile_dp(const uint16_t* row, const uint16_t* const* hi, const uint16_t* const* lo,
                               const float* const* xs, int64_t K, float* res) {
  constexpr int64_t B = 32;
  __m512 acc0[NT], acc1[NT], acc2[NT], acc3[NT];  // hi and lo chains for two blocks per iteration
  for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = acc2[t] = acc3[t] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 2 * B <= K; k += 2 * B) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(row + k);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(row + k + B);
    for (int t = 0; t < NT; ++t) {
      acc0[t] = _mm512_dpbf16_ps(acc0[t], w0, (__m512bh)_mm512_loadu_si512(hi[t] + k));
      acc1[t] = _mm512_dpbf16_ps(acc1[t], w0, (__m512bh)_mm512_loadu_si512(lo[t] + k));
      acc2[t] = _mm512_dpbf16_ps(acc2[t], w1, (__m512bh)_mm512_loadu_si512(hi[t] + k + B));
      acc3[t] = _mm512_dpbf16_ps(acc3[t], w1, (__m512bh)_mm512_loadu_si512(lo[t] + k + B));
    }
  }
  if (k + B <= K) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(row + k);
    for (int t = 0; t < NT; ++t) {
      acc0[t] = _mm512_dpbf16_ps(acc0[t], w0, (__m512bh)_mm512_loadu_si512(hi[t] + k));
      acc1[t] = _mm512_dpbf16_ps(acc1[t], w0, (__m512bh)_mm512_loadu_si512(lo[t] + k));
    }
    k += B;
  }
  for (int t = 0; t < NT; ++t) {
    float s = 0.f;
    for (int64_t kk = k; kk < K; ++kk) s = S::sfma(bf16_to_f32(row[kk]), xs[t][kk], s);
    res[t] = S::hsum(_mm512_add_ps(_mm512_add_ps(acc0[t], acc1[t]), _mm512_add_ps(acc2[t], acc3[t]))) + s;
  }
}
#endif

static inline float activate(int32_t act, float g, float u) {
  if (act == ACT_GPTOSS) {  // gpt-oss: clamped gate/up, glu = g * sigmoid(1.702 g), (u + 1) * glu
    g = fmin_(g, 7.f);
    u = fmax_(-7.f, fmin_(u, 7.f));
    return (u + 1.f) * (g / (1.f + __builtin_expf(-1.702f * g)));
  }
  if (act == ACT_GELU_TANH) {  // Gemma-4: gelu_pytorch_tanh(g) * u
    return 0.5f * g * (1.f + __builtin_tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
  }
  if (act == ACT_DSV4) {  // DeepSeek-V4: SiLU with the gate clamped above at 10, up to [-10, 10]
    g = fmin_(g, 10.f);
    u = fmax_(-10.f, fmin_(u, 10.f));
  }
  return g / (1.f + __builtin_expf(-g)) * u;  // SiLU-gated
}

// Phase 1's activations of one route's block of h indices [i0, i0 + n): the expert's gate/up biases added first
// where the plan has them (gpt-oss: row g's biases are gate_up_bias[g, 0:I] and [g, I:2I]).
static inline void activate_block(const Plan& p, int64_t row, int64_t i0, int64_t n, int nt, int t, const float* gate,
                                  const float* up, float* h) {
  if (!p.gate_up_bias) {
    for (int64_t i = 0; i < n; ++i) h[i] = activate(p.act, gate[i * nt + t], up[i * nt + t]);
    return;
  }
  const float* bg = p.gate_up_bias + row * 2 * p.I + i0;
  const float* bu = bg + p.I;
  for (int64_t i = 0; i < n; ++i) h[i] = activate(p.act, gate[i * nt + t] + bg[i], up[i * nt + t] + bu[i]);
}

// The operand side of a tile: nt fp32 vectors (and their bf16 hi/lo halves on the DP path).
struct Operands {
  int nt;
  const float* f[FT_NT_MAX];
  const uint16_t* hi[FT_NT_MAX];
  const uint16_t* lo[FT_NT_MAX];
  const int16_t* q[FT_NT_MAX];  // int16 blocks and their scales (FP4 on the AVX2 and AVX-512 paths)
  const float* qs[FT_NT_MAX];
};

// Per-thread scratch for scaled operands (this TU's own: the namespace is per ISA).
struct ScaleScratch {
  float* p = nullptr;
  int64_t cap = 0;
  ~ScaleScratch() { delete[] p; }
  float* get(int64_t n) {
    if (n > cap) {
      delete[] p;
      p = new float[n];
      cap = n;
    }
    return p;
  }
};
static thread_local ScaleScratch tl_scale_scratch;

// The operands a run of rows from `first` of a block-scaled bank is dotted with: in.f[t][k] * 256 * scale of
// (first's block row, k's block column); `half` picks one of two scratch halves (phase 1 keeps gate's and up's
// alive together). Every row of the run must share first's block row (phase units: kHBlock, kDBlock divide 128).
// The weight's scale multiplies the operand instead of the weight: the product w * scale * x rounds differently
// from the reference's (w * scale) * x, in the last bit (float32 summation order dwarfs it). Unscaled formats:
// the operands as they are.
template <class F>
static inline Operands scaled_operands(const Bank& bank, int64_t first, int64_t K, const Operands& in, int half) {
  if constexpr (!F::kScaled) {
    return in;
  } else {
    const float* s = static_cast<const float*>(bank.scale) + (first / kFp8Block) * (K / kFp8Block);
    float* buf = tl_scale_scratch.get(2 * FT_NT_MAX * K) + half * FT_NT_MAX * K;
    Operands out = in;
    for (int t = 0; t < in.nt; ++t) {
      float* dst = buf + t * K;
      const float* src = in.f[t];
      for (int64_t c = 0; c < K / kFp8Block; ++c) {
        const float f = s[c] * 256.f;
        for (int64_t j = c * kFp8Block; j < (c + 1) * kFp8Block; ++j) dst[j] = src[j] * f;
      }
      out.f[t] = dst;
    }
    return out;
  }
}

// res[t] = row . ops.f[t] for t < ops.nt, dispatching the runtime nt to a template instance.
template <class F, bool DP>
static inline void dot_row(typename F::Row row, const Operands& o, int64_t K, float* res) {
#ifdef FT_DOT_BF16
  if constexpr (DP && F::kFp4) {
    switch (o.nt) {
      case 1: return dot_tile_dp_fp4<F::kNV, 1>(row, o.hi, o.lo, K, res);
      case 2: return dot_tile_dp_fp4<F::kNV, 2>(row, o.hi, o.lo, K, res);
      case 3: return dot_tile_dp_fp4<F::kNV, 3>(row, o.hi, o.lo, K, res);
      default: return dot_tile_dp_fp4<F::kNV, 4>(row, o.hi, o.lo, K, res);
    }
  } else if constexpr (DP) {
    const uint16_t* r = reinterpret_cast<const uint16_t*>(row);
    switch (o.nt) {
      case 1: return dot_tile_dp<1>(r, o.hi, o.lo, o.f, K, res);
      case 2: return dot_tile_dp<2>(r, o.hi, o.lo, o.f, K, res);
      case 3: return dot_tile_dp<3>(r, o.hi, o.lo, o.f, K, res);
      default: return dot_tile_dp<4>(r, o.hi, o.lo, o.f, K, res);
    }
  }
#endif
#ifdef FT_FP4_Q16I
  if constexpr (F::kFp4) {  // the high-byte integer path (dot_fp4_avx512.h, dot_fp4_avx2i.h); the generic tiles
    // below are never instantiated for FP4 here (no S::load_e2m1x2)
    switch (o.nt) {
#if FT_NT_MAX >= 4
      case 4: return dot_tile_fp4i<F::kNV, 4>(row, o.q, o.qs, K, res);
      case 3: return dot_tile_fp4i<F::kNV, 3>(row, o.q, o.qs, K, res);
#endif
      case 2: return dot_tile_fp4i<F::kNV, 2>(row, o.q, o.qs, K, res);
      default: return dot_tile_fp4i<F::kNV, 1>(row, o.q, o.qs, K, res);
    }
  } else
#endif
  {
    switch (o.nt) {
#if FT_NT_MAX >= 4
      case 4: return dot_tile<F, 4>(row, o.f, K, res);
      case 3: return dot_tile<F, 3>(row, o.f, K, res);
#endif
#if FT_NT_MAX >= 2
      case 2: return dot_tile<F, 2>(row, o.f, K, res);
#endif
      default: return dot_tile<F, 1>(row, o.f, K, res);
    }
  }
}

#include "dot_rows.h"

// Operands of sorted routes [s, s + nt): their tokens' x rows (phase 1) or their h rows (phase 2).
template <bool DP>
static inline Operands operands(const Plan& p, int64_t s, int nt, bool x_side) {
  Operands o;
  o.nt = nt;
  for (int t = 0; t < nt; ++t) {
    const int64_t off = x_side ? static_cast<int64_t>(p.s_tok[s + t]) * p.D : (s + t) * p.I;
    o.f[t] = (x_side ? p.x : p.h) + off;
    if (DP) o.hi[t] = (x_side ? p.x_hi : p.h_hi) + off, o.lo[t] = (x_side ? p.x_lo : p.h_lo) + off;
    if (p.x_q) o.q[t] = (x_side ? p.x_q : p.h_q) + off, o.qs[t] = (x_side ? p.x_qs : p.h_qs) + off / 32;
  }
  return o;
}

// Phase-1 unit: h[s, i] for the group's routes s and h indices i of one block.
template <class F, bool DP>
static void phase1(const Plan& p, int64_t u) {
  const int64_t D = p.D, I = p.I, nb = (I + p.hblock - 1) / p.hblock;
  const int64_t g = u / nb, i0 = (u % nb) * p.hblock, n = imin(I, i0 + p.hblock) - i0;
  const int64_t base = p.group_row[g] * 2 * I;  // first gate row of this expert
  const int64_t s1 = p.group_start[g + 1];
  float gate[kMaxHBlock * FT_NT_MAX], up[kMaxHBlock * FT_NT_MAX];
  for (int64_t s = p.group_start[g]; s < s1; s += FT_NT_MAX) {
    const int nt = static_cast<int>(imin(FT_NT_MAX, s1 - s));
    const Operands o = operands<DP>(p, s, nt, true);
    const Operands og = scaled_operands<F>(p.gate_up, base + i0, D, o, 0);  // o itself for unscaled formats
    const Operands ou = scaled_operands<F>(p.gate_up, base + I + i0, D, o, 1);
    if (nt == 1) {  // batch 1: Plan::rows weight streams at a time
      dot_row_run<F, DP>(p.gate_up, base + i0, n, D, og, gate, p.rows);
      dot_row_run<F, DP>(p.gate_up, base + I + i0, n, D, ou, up, p.rows);
    } else {
      for (int64_t i = 0; i < n; ++i) dot_row<F, DP>(F::row(p.gate_up, base + i0 + i, D), og, D, gate + i * nt);
      for (int64_t i = 0; i < n; ++i) dot_row<F, DP>(F::row(p.gate_up, base + I + i0 + i, D), ou, D, up + i * nt);
    }
    for (int t = 0; t < nt; ++t) {
      float* h = p.h + (s + t) * I + i0;
      activate_block(p, p.group_row[g], i0, n, nt, t, gate, up, h);
      if (F::kFp4 && p.h_q) quantize_q16i(h, i0, n, I, p.h_q + (s + t) * I, p.h_qs + (s + t) * I / 32);
      if (DP) {
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t hi = f32_to_bf16(h[i]);
          const int64_t at = (s + t) * I + (F::kFp4 ? fp4_dp_pos(i0 + i, I) : i0 + i);
          p.h_hi[at] = hi;
          p.h_lo[at] = f32_to_bf16(h[i] - bf16_to_f32(hi));
        }
      }
    }
  }
}

// Phase-2 unit: y[s, d] = down[d, :] . h[s, :] for the group's routes s and one block of rows d.
template <class F, bool DP>
static void phase2(const Plan& p, int64_t u) {
  const int64_t D = p.D, I = p.I, nb = (D + p.dblock - 1) / p.dblock;
  const int64_t g = u / nb, d0 = (u % nb) * p.dblock, d1 = imin(D, d0 + p.dblock);
  const int64_t base = p.group_row[g] * D;  // first down row of this expert
  const int64_t s1 = p.group_start[g + 1];
  for (int64_t s = p.group_start[g]; s < s1; s += FT_NT_MAX) {
    const int nt = static_cast<int>(imin(FT_NT_MAX, s1 - s));
    const Operands o = scaled_operands<F>(p.down, base + d0, I, operands<DP>(p, s, nt, false), 0);
    if (nt == 1) {
      dot_row_run<F, DP>(p.down, base + d0, d1 - d0, I, o, p.y + s * D + d0, p.rows);
      continue;
    }
    for (int64_t d = d0; d < d1; ++d) {
      float res[FT_NT_MAX];
      dot_row<F, DP>(F::row(p.down, base + d, I), o, I, res);
      for (int t = 0; t < nt; ++t) p.y[(s + t) * D + d] = res[t];
    }
  }
}

// Phase-3 unit: out[t, c0:c1] = sum over t's routes s (ascending) of w_s * y[s, c0:c1]; zero if none.
static void phase3(const Plan& p, int64_t u) {
  const int64_t D = p.D, nb = (D + p.oblock - 1) / p.oblock;
  const int64_t t = u / nb, c0 = (u % nb) * p.oblock, c1 = imin(D, c0 + p.oblock);
  float* o = p.out + (p.t0 + t) * D;
  for (int64_t c = c0; c < c1; ++c) o[c] = 0.f;
  for (int64_t j = p.tok_start[t]; j < p.tok_start[t + 1]; ++j) {
    const int64_t s = p.tok_route[j];
    const float w = p.s_w[s];
    const float* y = p.y + s * D;
    for (int64_t c = c0; c < c1; ++c) o[c] = S::sfma(w, y[c], o[c]);
  }
}

// Sum of uint64 words: integer adds are associative, so the compiler vectorises this with the TU's
// ISA. The streaming-read reference the kernel is measured against (hardware prefetch only): like the
// kernel's batch-1 row blocking, the slice is cut into 4 contiguous parts read side by side (4 ascending
// streams per thread; one stream per thread leaves DRAM bandwidth unused on large cores).
static uint64_t stream_sum(const uint64_t* p, int64_t words) {
  constexpr int kParts = 4, kLanes = 8;
  const int64_t m = words / kParts / kLanes * kLanes;  // words per part, whole lanes
  uint64_t acc[kParts][kLanes] = {};
  for (int64_t i = 0; i < m; i += kLanes)
    for (int r = 0; r < kParts; ++r)
      for (int j = 0; j < kLanes; ++j) acc[r][j] += p[r * m + i + j];
  uint64_t s = 0;
  for (int64_t i = kParts * m; i < words; ++i) s += p[i];
  for (int r = 0; r < kParts; ++r)
    for (int j = 0; j < kLanes; ++j) s += acc[r][j];
  return s;
}

static void phase1_dispatch(const Plan& p, int64_t u) {
  if (p.fmt == FMT_FP8_BLOCK) return phase1<FmtFP8, false>(p, u);
#ifdef FT_DOT_BF16
  if (p.fmt == FMT_MXFP4 && p.x_hi) return phase1<FmtFP4<false>, true>(p, u);
  if (p.fmt == FMT_NVFP4 && p.x_hi) return phase1<FmtFP4<true>, true>(p, u);
#endif
  if (p.fmt == FMT_MXFP4) return phase1<FmtFP4<false>, false>(p, u);
  if (p.fmt == FMT_NVFP4) return phase1<FmtFP4<true>, false>(p, u);
#ifdef FT_DOT_BF16
  if (p.fmt == FMT_BF16 && p.x_hi) return phase1<FmtBF16, true>(p, u);
#endif
  if (p.fmt == FMT_BF16) return phase1<FmtBF16, false>(p, u);
  return phase1<FmtF32, false>(p, u);
}

static void phase2_dispatch(const Plan& p, int64_t u) {
  if (p.fmt == FMT_FP8_BLOCK) return phase2<FmtFP8, false>(p, u);
#ifdef FT_DOT_BF16
  if (p.fmt == FMT_MXFP4 && p.h_hi) return phase2<FmtFP4<false>, true>(p, u);
  if (p.fmt == FMT_NVFP4 && p.h_hi) return phase2<FmtFP4<true>, true>(p, u);
#endif
  if (p.fmt == FMT_MXFP4) return phase2<FmtFP4<false>, false>(p, u);
  if (p.fmt == FMT_NVFP4) return phase2<FmtFP4<true>, false>(p, u);
#ifdef FT_DOT_BF16
  if (p.fmt == FMT_BF16 && p.h_hi) return phase2<FmtBF16, true>(p, u);
#endif
  if (p.fmt == FMT_BF16) return phase2<FmtBF16, false>(p, u);
  return phase2<FmtF32, false>(p, u);
}

}  // namespace FT_ISA_NS
}  // namespace ft
