// The weight formats the expert kernel reads (F in dot_impl.h): float32, bf16, fp8 e4m3 blocks and the FP4 formats
// (MXFP4, NVFP4). Each gives Row, row(bank, index, K), load2(row, k, a, b), at(row, k) and kScaled (dot_impl.h's
// header says what they mean). Included by dot_impl.h inside its ISA namespace, after its small helpers.
#pragma once

struct FmtF32 {
  static constexpr bool kScaled = false, kFp4 = false;
  using Row = const float*;
  static inline Row row(const Bank& bank, int64_t index, int64_t K) { return static_cast<const float*>(bank.w) + index * K; }
  static inline void load2(Row r, int64_t k, S::vec& a, S::vec& b) {
    a = S::load(r + k);
    b = S::load(r + k + S::W);
  }
  static inline float at(Row r, int64_t k) { return r[k]; }
};

struct FmtBF16 {
  static constexpr bool kScaled = false, kFp4 = false;
  using Row = const uint16_t*;
  static inline Row row(const Bank& bank, int64_t index, int64_t K) {
    return static_cast<const uint16_t*>(bank.w) + index * K;
  }
  static inline void load2(Row r, int64_t k, S::vec& a, S::vec& b) { S::load_bf16x2(r + k, a, b); }
  static inline float at(Row r, int64_t k) { return bf16_to_f32(r[k]); }
};

// fp8 e4m3 with 128x128 block scales: rows decode to the values / 256 (exact); the operands carry 256 * scale.
struct FmtFP8 {
  static constexpr bool kScaled = true, kFp4 = false;
  using Row = const uint8_t*;
  static inline Row row(const Bank& bank, int64_t index, int64_t K) { return static_cast<const uint8_t*>(bank.w) + index * K; }
  static inline void load2(Row r, int64_t k, S::vec& a, S::vec& b) { S::load_fp8x2(r + k, a, b); }
  static inline float at(Row r, int64_t k) { return fp8_to_f32(r[k]) * (1.f / 256.f); }
};

// Scale decode tables of the FP4 formats: e4m3 codes (NVFP4) and e8m0 codes (MXFP4) -> fp32, each times 0.5, which
// undoes load_e2m1x2's doubling (exact: powers of two). Built at compile time (constexpr, from fp8_to_f32's exact
// values): a table built when the library loads would run this ISA's instructions in its initializer, on every CPU
// (an AVX-512 one: SIGILL on an AVX2 machine).
constexpr float fp4_pow2(int n) {  // 2^n, exact (subnormals included)
  float f = 1.f;
  for (; n > 0; --n) f *= 2.f;
  for (; n < 0; ++n) f *= 0.5f;
  return f;
}
constexpr float fp4_e4m3_value(int i) {  // = fp8_to_f32(i) (the NaN codes as +-480)
  const int e = (i >> 3) & 15, m = i & 7;
  const float f = e ? (1.f + m / 8.f) * fp4_pow2(e - 7) : m / 512.f;
  return (i & 0x80) ? -f : f;
}
constexpr float fp4_e8m0_value(int i) {  // 2^(i - 127); 255 (NaN in OCP's e8m0) as +inf, as the bit pattern 0x7F800000
  return i == 255 ? __builtin_huge_valf() : fp4_pow2(i - 127);
}
struct Fp4ScaleTables {
  float e4m3[256], e8m0[256], e8m0_half[256];
  constexpr Fp4ScaleTables() : e4m3(), e8m0(), e8m0_half() {
    for (int i = 0; i < 256; ++i) {
      e4m3[i] = fp4_e4m3_value(i);
      e8m0[i] = fp4_e8m0_value(i);
      e8m0_half[i] = e8m0[i] * 0.5f;
    }
  }
};
static constexpr Fp4ScaleTables kFp4Scales{};

// A FP4 row: its packed bytes, its scale row, and (NVFP4) the tensor's multiplier from the scale row's tail.
struct Fp4Row {
  const uint8_t* w;
  const uint8_t* s;
  float mult;
};

// FP4 e2m1 rows (MXFP4: NV = false, e8m0 per 32; NVFP4: NV = true, e4m3 per 16 times the row's multiplier). A
// group's scale is computed as the reference computes it (e4m3 * multiplier, rounded once), then halved exactly.
template <bool NV>
struct FmtFP4 {
  static constexpr bool kScaled = false, kFp4 = true, kNV = NV;
  static constexpr int64_t G = NV ? 16 : 32;  // elements per scale
  using Row = Fp4Row;
  static inline Row row(const Bank& bank, int64_t index, int64_t K) {
    const int64_t sb = NV ? K / 16 + 4 : K / 32;  // scale-row bytes
    Fp4Row r{static_cast<const uint8_t*>(bank.w) + index * (K / 2), static_cast<const uint8_t*>(bank.scale) + index * sb,
             1.f};
    if (NV) __builtin_memcpy(&r.mult, r.s + K / 16, 4);
    return r;
  }
  static inline float scale(const Row& r, int64_t k) {
    if (NV) return (kFp4Scales.e4m3[r.s[k / G]] * r.mult) * 0.5f;
    return kFp4Scales.e8m0[r.s[k / G]] * 0.5f;
  }
  static inline void load2(const Row& r, int64_t k, S::vec& a, S::vec& b) {
    S::load_e2m1x2(r.w + k / 2, a, b);  // 2W elements from k (k even: whole bytes)
    a = S::mul(a, S::set1(scale(r, k)));
    b = S::mul(b, S::set1(scale(r, k + S::W)));
  }
  static inline float at(const Row& r, int64_t k) {
    static constexpr float kTwice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    const uint8_t byte = r.w[k / 2];
    return kTwice[(k & 1) ? byte >> 4 : byte & 15] * scale(r, k);
  }
};
