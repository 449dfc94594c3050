// AVX2 + FMA path (compiled with -mavx2 -mfma -mf16c): 8 fp32 lanes, bf16 widened with vpmovzxwd + shift, fp8
// e4m3 widened through fp16 (see load_fp8x2).
#include <immintrin.h>

#include "kernel_api.h"

#define FT_ISA_NS avx2
#define FT_ROWS_MAX 2  // batch-1 rows at once (dot_rows.h)
#define FT_NT_MAX 2  // 2 tokens x 4 accumulators = 8 of the 16 ymm registers

namespace ft {
namespace avx2 {
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
  // 8 bytes of e2m1 nibbles (16 codes, low nibble first) -> two fp32 vectors of twice their values: the nibbles
  // interleaved into element order index a 16-entry table of 2 * e2m1 (small integers) with one byte shuffle.
  static inline void load_e2m1x2(const uint8_t* p, vec& a, vec& b) {
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i idx = _mm_unpacklo_epi8(_mm_and_si128(bytes, m), _mm_and_si128(_mm_srli_epi16(bytes, 4), m));
    const __m128i v = _mm_shuffle_epi8(lut, idx);
    a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
    b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
  }
  // load_e2m1x2 with the codes' group scale `s` applied (2W codes of one group: FmtFP4::load2): the 8 magnitudes
  // times s make a table that each code's low 3 bits index (vpermps), its bit 3 flips the sign; each code's nibble
  // reaches its lane by a variable shift of the 4 bytes broadcast. The same values as load_e2m1x2 times s (one
  // rounding), in 10 instructions instead of 11 plus two multiplies, 2 of them on the shuffle port instead of 5.
  static constexpr bool kE2m1Scaled = true;
  static inline void load_e2m1x2_scaled(const uint8_t* p, float s, vec& a, vec& b) {
    const __m256 table = _mm256_mul_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 6, 8, 12), _mm256_set1_ps(s));
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
    uint32_t lo, hi;
    __builtin_memcpy(&lo, p, 4);
    __builtin_memcpy(&hi, p + 4, 4);
    const __m256i ca = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(lo)), shifts);
    const __m256i cb = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(hi)), shifts);
    a = _mm256_xor_ps(_mm256_permutevar8x32_ps(table, ca),
                      _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(ca, 28), sign)));
    b = _mm256_xor_ps(_mm256_permutevar8x32_ps(table, cb),
                      _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(cb, 28), sign)));
  }
};
}  // namespace avx2
}  // namespace ft

#include "dot_impl.h"

ft::IsaOps ft::ops_avx2() { return IsaOps{avx2::phase1_dispatch, avx2::phase2_dispatch, avx2::phase3, false, avx2::stream_sum}; }
