// FP4 rows (MXFP4, NVFP4) on AVX512-BF16: 32 e2m1 codes become 32 bf16 weights by one 16-bit table permute
// (twice the e2m1 values, small integers: exact in bf16), vdpbf16ps takes them against the operand's bf16 hi and
// lo halves (dot_tile_dp's split, ~16 mantissa bits), and the 32 codes' group scales multiply the 16 partial sums
// once (MXFP4: one scale per 32 codes; NVFP4: lanes 0-7 hold codes 0-15, lanes 8-15 codes 16-31, one scale each).
// Per 32 codes: 4 decode instructions, 2 dot products, a scale permute and one multiply-add, where the fp32 path
// (dot_tile with FmtFP4) takes 11 decode instructions, two scale lookups, broadcasts and multiplies, and 2 FMAs;
// 3x the packed GB/s on the dev box's Zen 4 (docs/benchmarks.md). Included by dot_impl.h inside its ISA namespace
// (FT_DOT_BF16 only), after FmtFP4.
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

// A row's group scales (FmtFP4's own values, bit for bit), decoded 16 at a time: the 256 codes' (NVFP4) or 512
// codes' (MXFP4) whose scale bytes one masked 16-byte load holds; then each 32-code block's lane vector is one permute.
template <bool NV>
struct Fp4Scales {
  static constexpr int64_t kG = NV ? 16 : 32, kSpan = 16 * kG;
  // The scales of codes [k, min(K, k + kSpan)), k a multiple of kSpan.
  static inline __m512 decode(const Fp4Row& r, int64_t k, int64_t K) {
    const int64_t g = k / kG, n = imin(16, K / kG - g);
    const __m128i b = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << n) - 1), r.s + g);
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
  // Block j's (codes kSpan-start + 32 j ...) scale per vdpbf16ps lane: MXFP4 one scale; NVFP4 lanes 0-7 scale 2j
  // (codes 0-15), lanes 8-15 scale 2j + 1.
  static inline __m512 lanes(__m512 s, int64_t j) {
    if constexpr (NV) {
      const __m512i base = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
      return _mm512_permutexvar_ps(_mm512_add_epi32(base, _mm512_set1_epi32(static_cast<int>(2 * j))), s);
    } else {
      return _mm512_permutexvar_ps(_mm512_set1_epi32(static_cast<int>(j)), s);
    }
  }
};

// acc += scale * (w . hi[k:k+32] + w . lo[k:k+32]), w the row's codes [k, k + 32), scale their lane scales.
static inline __m512 fp4_dp_block(int64_t k, __m512bh w, __m512 scale, const uint16_t* hi, const uint16_t* lo,
                                  __m512 acc) {
  __m512 p = _mm512_dpbf16_ps(_mm512_setzero_ps(), w, (__m512bh)_mm512_loadu_si512(hi + k));
  p = _mm512_dpbf16_ps(p, w, (__m512bh)_mm512_loadu_si512(lo + k));
  return _mm512_fmadd_ps(p, scale, acc);
}

// res[t] = row . x[t] for t < NT (hi / lo: the tokens' bf16 halves); two accumulators, blocks alternating (a span
// holds an even number of blocks: only the row's last block can be alone, and goes to the first).
template <bool NV, int NT>
static inline void dot_tile_dp_fp4(const Fp4Row& row, const uint16_t* const* hi, const uint16_t* const* lo, int64_t K,
                                   float* res) {
  using Sc = Fp4Scales<NV>;
  const __m512i table = fp4_bf16_table();
  __m512 acc0[NT], acc1[NT];
  for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += Sc::kSpan) {
    const __m512 sc = Sc::decode(row, k0, K);
    const int64_t k1 = imin(K, k0 + Sc::kSpan);
    int64_t k = k0;
    for (; k + 64 <= k1; k += 64) {
      const int64_t j = (k - k0) / 32;
      const __m512bh w0 = fp4_bf16x32(row.w + k / 2, table), w1 = fp4_bf16x32(row.w + k / 2 + 16, table);
      const __m512 s0 = Sc::lanes(sc, j), s1 = Sc::lanes(sc, j + 1);
      for (int t = 0; t < NT; ++t) {
        acc0[t] = fp4_dp_block(k, w0, s0, hi[t], lo[t], acc0[t]);
        acc1[t] = fp4_dp_block(k + 32, w1, s1, hi[t], lo[t], acc1[t]);
      }
    }
    if (k < k1) {
      const __m512bh w0 = fp4_bf16x32(row.w + k / 2, table);
      const __m512 s0 = Sc::lanes(sc, (k - k0) / 32);
      for (int t = 0; t < NT; ++t) acc0[t] = fp4_dp_block(k, w0, s0, hi[t], lo[t], acc0[t]);
    }
  }
  for (int t = 0; t < NT; ++t) res[t] = S::hsum(_mm512_add_ps(acc0[t], acc1[t]));
}

// One token against R rows at once (dot_rows.h's batch-1 row blocking), each row as dot_tile_dp_fp4<NV, 1>.
template <bool NV, int R>
static inline void dot_rows_dp_fp4(const Fp4Row* rows, const uint16_t* hi, const uint16_t* lo, int64_t K,
                                   float* res) {
  using Sc = Fp4Scales<NV>;
  const __m512i table = fp4_bf16_table();
  __m512 acc0[R], acc1[R], sc[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < K; k0 += Sc::kSpan) {
    for (int r = 0; r < R; ++r) sc[r] = Sc::decode(rows[r], k0, K);
    const int64_t k1 = imin(K, k0 + Sc::kSpan);
    int64_t k = k0;
    for (; k + 64 <= k1; k += 64) {
      const int64_t j = (k - k0) / 32;
      for (int r = 0; r < R; ++r) {
        const __m512bh w0 = fp4_bf16x32(rows[r].w + k / 2, table), w1 = fp4_bf16x32(rows[r].w + k / 2 + 16, table);
        acc0[r] = fp4_dp_block(k, w0, Sc::lanes(sc[r], j), hi, lo, acc0[r]);
        acc1[r] = fp4_dp_block(k + 32, w1, Sc::lanes(sc[r], j + 1), hi, lo, acc1[r]);
      }
    }
    if (k < k1) {
      for (int r = 0; r < R; ++r)
        acc0[r] = fp4_dp_block(k, fp4_bf16x32(rows[r].w + k / 2, table), Sc::lanes(sc[r], (k - k0) / 32), hi, lo,
                               acc0[r]);
    }
  }
  for (int r = 0; r < R; ++r) res[r] = S::hsum(_mm512_add_ps(acc0[r], acc1[r]));
}
