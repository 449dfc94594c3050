// SIMD traits for the AVX2 + FMA path (included by isa_avx2.cpp inside its namespace): 8 fp32 lanes, bf16 widened
// with vpmovzxwd + shift, fp8 e4m3 widened through fp16 (see load_fp8x2).
#pragma once
#include <immintrin.h>

struct S {
  static constexpr int W = 8;
  using vec = __m256;
  static inline vec zero() { return _mm256_setzero_ps(); }
  static inline vec load(const float* p) { return _mm256_loadu_ps(p); }
  static inline vec fma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  static inline vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static inline vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
  static inline vec set1(float f) { return _mm256_set1_ps(f); }
  static inline float hsum(vec a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static inline float sfma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
  static inline vec widen(__m128i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)); }
  static inline void load_bf16x2(const uint16_t* p, vec& a, vec& b) {
    a = widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    b = widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
  // 16 e4m3 bytes -> two fp32 vectors of the values / 256. Sign-extending a byte to 16 bits and shifting it left
  // by 7 puts sign, exponent and mantissa where fp16 keeps them (the sign's copy in bit 14 is masked off): the fp16
  // value is the e4m3 value / 256 exactly, subnormals included (fp16's exponent bias is 8 above e4m3's), and
  // vcvtph2ps widens it exactly (the operands carry the 256 and the block scale: dot_impl.h, scaled_operands).
  static inline void load_fp8x2(const uint8_t* p, vec& a, vec& b) {
    const __m256i h = _mm256_and_si256(
        _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 7),
        _mm256_set1_epi16(static_cast<short>(0xBFFF)));
    a = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    b = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
  }
  // FP4 rows run in dot_fp4_avx2i.h (FT_FP4_Q16I): declared for FmtFP4::load2, never called.
  static void load_e2m1x2(const uint8_t* p, vec& a, vec& b);
};
