// Portable path (no -m flags): a fixed-width "vector" of plain floats the compiler may vectorise.
// Used on CPUs without AVX2+FMA and on non-x86 machines.
#include "kernel_api.h"

#define FT_ISA_NS generic
#define FT_ROWS_MAX 4  // batch-1 rows at once (dot_rows.h)
#define FT_NT_MAX 1

namespace ft {
namespace generic {
// e4m3 code -> its value / 256 in fp32 (as the SIMD paths decode), built once from the exact scalar decode.
struct Fp8Table {
  float v[256];
  Fp8Table() {
    for (int i = 0; i < 256; ++i) v[i] = fp8_to_f32(static_cast<uint8_t>(i)) * (1.f / 256.f);
  }
};
static const Fp8Table kFp8;

struct S {
  static constexpr int W = 8;
  struct vec {
    float v[8];
  };
  static inline vec zero() { return vec{}; }
  static inline vec load(const float* p) {
    vec r;
    for (int i = 0; i < W; ++i) r.v[i] = p[i];
    return r;
  }
  static inline vec fma(vec a, vec b, vec c) {
    for (int i = 0; i < W; ++i) c.v[i] = a.v[i] * b.v[i] + c.v[i];
    return c;
  }
  static inline vec add(vec a, vec b) {
    for (int i = 0; i < W; ++i) a.v[i] += b.v[i];
    return a;
  }
  static inline float hsum(vec a) {
    float s = 0.f;
    for (int i = 0; i < W; ++i) s += a.v[i];
    return s;
  }
  static inline float sfma(float a, float b, float c) { return a * b + c; }
  static inline vec mul(vec a, vec b) {
    for (int i = 0; i < W; ++i) a.v[i] *= b.v[i];
    return a;
  }
  static inline vec set1(float f) {
    vec r;
    for (int i = 0; i < W; ++i) r.v[i] = f;
    return r;
  }
  static inline void load_e2m1x2(const uint8_t* p, vec& a, vec& b) {  // twice the values, as the SIMD paths
    static constexpr float kTwice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    for (int i = 0; i < W / 2; ++i) {
      a.v[2 * i] = kTwice[p[i] & 15], a.v[2 * i + 1] = kTwice[p[i] >> 4];
      b.v[2 * i] = kTwice[p[W / 2 + i] & 15], b.v[2 * i + 1] = kTwice[p[W / 2 + i] >> 4];
    }
  }
  static inline void load_bf16x2(const uint16_t* p, vec& a, vec& b) {
    for (int i = 0; i < W; ++i) a.v[i] = bf16_to_f32(p[i]), b.v[i] = bf16_to_f32(p[W + i]);
  }
  static inline void load_fp8x2(const uint8_t* p, vec& a, vec& b) {
    for (int i = 0; i < W; ++i) a.v[i] = kFp8.v[p[i]], b.v[i] = kFp8.v[p[W + i]];
  }
};
}  // namespace generic
}  // namespace ft

#include "dot_impl.h"

ft::IsaOps ft::ops_generic() { return IsaOps{generic::phase1_dispatch, generic::phase2_dispatch, generic::phase3, OPERANDS_F32, generic::stream_sum}; }
