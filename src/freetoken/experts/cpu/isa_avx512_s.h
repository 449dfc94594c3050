// SIMD traits for the AVX-512 paths (included by isa_avx512.cpp and isa_avx512bf16.cpp, each in
// its own namespace): 16 fp32 lanes, bf16 widened with vpmovzxwd + shift.
#pragma once
#include <immintrin.h>

struct S {
  static constexpr int W = 16;
  using vec = __m512;
  static inline vec zero() { return _mm512_setzero_ps(); }
  static inline vec load(const float* p) { return _mm512_loadu_ps(p); }
  static inline vec fma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  static inline vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
  static inline vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
  static inline vec set1(float f) { return _mm512_set1_ps(f); }
  // Fixed-order reduction (not _mm512_reduce_add_ps, which trips a GCC 12 -Wuninitialized false alarm).
  static inline float hsum(vec a) {
    const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_castps512_ps256(_mm512_shuffle_f32x4(a, a, 0xEE)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static inline float sfma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
  static inline vec widen(__m256i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); }
  static inline void load_bf16x2(const uint16_t* p, vec& a, vec& b) {
    a = widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    b = widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
  }
  // 32 e4m3 bytes -> two fp32 vectors of the values / 256, through fp16 as on the AVX2 path (isa_avx2.cpp says
  // why it is exact).
  static inline void load_fp8x2(const uint8_t* p, vec& a, vec& b) {
    const __m512i h = _mm512_and_si512(
        _mm512_slli_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 7),
        _mm512_set1_epi16(static_cast<short>(0xBFFF)));
    a = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    b = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
  }
  // 16 bytes of e2m1 nibbles (32 codes) -> two fp32 vectors of twice their values, by one 16-entry table shuffle
  // over all 32 codes (vpshufb on a ymm: the table in both lanes), as on the AVX2 path (isa_avx2.cpp).
  static inline void load_e2m1x2(const uint8_t* p, vec& a, vec& b) {
    const __m256i lut = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
                                         0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i lo = _mm_and_si128(bytes, m), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), m);
    const __m256i idx = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    const __m256i v = _mm256_shuffle_epi8(lut, idx);
    a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v)));
    b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1)));
  }
};
