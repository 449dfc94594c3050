// The CPU decode step's small float32 ops, one call each instead of dozens of tiny torch ops:
// the residual add + RMSNorm, the router's softmax + top-k, a linear on bf16 weights widened exactly, and a
// decode layer's attention after its QKV projection (q/k per-head RMSNorm, rotate-half rotary from the
// precomputed tables, the new K/V into the paged pool, attention of each sequence's one new token over its
// pages). Operation order follows the torch references (kernels/norm.py, kernels/route.py, layers/rope.py,
// kernels/attention/decode_reference.py); built with -ffp-contract=off so no product-sum is fused into an FMA
// the references do not have. The hot loops are cloned for AVX-512 and AVX2 (picked when the library loads).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define FT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))  // picked at load time
#else
#define FT_CLONES
#endif

namespace {

// sum of a[i] * b[i] in 16 independent partial sums (so the compiler vectorises it without reassociating)
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  float s = 0.f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

// x [D] -> y [D] = w * (x * rsqrt(mean(x^2) + eps))
inline void rms_row(const float* x, const float* w, float* y, int64_t D, float eps) {
  const float ss = dot(x, x, D);
  const float r = 1.f / std::sqrt(ss / static_cast<float>(D) + eps);
  for (int64_t i = 0; i < D; ++i) y[i] = w[i] * (x[i] * r);
}

// x [hd] in place: optional per-head RMSNorm, then rotate-half rotary over the first rot dims
inline void norm_rope(float* x, const float* w, float eps, const float* cos, const float* sin, int hd, int rot,
                      float* tmp) {
  if (w) rms_row(x, w, x, hd, eps);
  const int half = rot / 2;
  for (int i = 0; i < rot; ++i) {
    const float rotated = i < half ? -x[i + half] : x[i - half];
    tmp[i] = x[i] * cos[i] + rotated * sin[i];
  }
  for (int i = 0; i < rot; ++i) x[i] = tmp[i];
}

}  // namespace

extern "C" {

// y [T, O] = x [T, I] @ w^T, w [O, I] bf16 (every value widened exactly), float32 products and sums in 16
// partial sums per row: a bf16 checkpoint's linear under float32 steps from half the bytes.
FT_CLONES void ft_linear_bf16(const float* x, int64_t T, int64_t I, const uint16_t* w, int64_t O, float* y) {
  for (int64_t o = 0; o < O; ++o) {  // each weight row read from memory once, for every token
    const uint16_t* r = w + o * I;
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = x + t * I;
      float acc[16] = {};
      int64_t i = 0;
      for (; i + 16 <= I; i += 16)
        for (int j = 0; j < 16; ++j) {
          const uint32_t u = static_cast<uint32_t>(r[i + j]) << 16;
          float f;
          std::memcpy(&f, &u, 4);
          acc[j] += f * xt[i + j];
        }
      float s = 0.f;
      for (; i < I; ++i) {
        const uint32_t u = static_cast<uint32_t>(r[i]) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        s += f * xt[i];
      }
      for (int j = 0; j < 16; ++j) s += acc[j];
      y[t * O + o] = s;
    }
  }
}

// h, delta, sum, y [T, D]; w [D]. sum = h + delta (delta null: sum unused, y = rms(h)); y = rms(sum).
FT_CLONES void ft_add_rms_norm(const float* h, const float* delta, const float* w, float* sum, float* y, int64_t T,
                               int64_t D, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    const float* src = h + t * D;
    if (delta) {
      float* s = sum + t * D;
      const float* d = delta + t * D;
      for (int64_t i = 0; i < D; ++i) s[i] = src[i] + d[i];
      src = s;
    }
    rms_row(src, w, y + t * D, D, eps);
  }
}

// Router logits [T, E] -> the top k of softmax(logits) per row, descending (ties: the lower expert first):
// ids [T, k] int64, weights [T, k] float32, renormalised to sum 1 when norm != 0.
void ft_route(const float* logits, int64_t T, int64_t E, int64_t k, int norm, int64_t* ids, float* w) {
  std::vector<float> p(E);
  std::vector<char> taken(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    float mx = -INFINITY, sum = 0.f;
    for (int64_t e = 0; e < E; ++e) mx = l[e] > mx ? l[e] : mx;
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - mx));
    for (int64_t e = 0; e < E; ++e) p[e] /= sum, taken[e] = 0;
    float picked = 0.f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
      taken[best] = 1;
      ids[t * k + j] = best, w[t * k + j] = p[best], picked += p[best];
    }
    if (norm)
      for (int64_t j = 0; j < k; ++j) w[t * k + j] /= picked;
  }
}

struct DecodeAttnArgs {
  float* qkv;               // [B, (H + 2 Hkv) hd], rewritten in place (normed, rotated q and k)
  int64_t B, H, Hkv, hd, rot;
  const float* q_norm;      // [hd] or null
  const float* k_norm;      // [hd] or null
  float eps;
  const int64_t* positions;  // [B]
  const float* cos;         // [max_pos, rot]
  const float* sin;
  int64_t max_pos;
  const int64_t* slot_mapping;  // [B] the new token's KV slot
  float* k_cache;           // [n_slots, Hkv, hd]
  float* v_cache;
  int64_t n_slots;
  const int32_t* block_table;  // [B, P]
  int64_t P;
  const int32_t* seq_lens;  // [B], the new token included
  int64_t page_size;
  int64_t window;           // <= 0: none
  float scale;
  float* out;               // [B, H hd]
};

// 0, or -1: a position, slot, length or page out of range (nothing is written past the pool).
FT_CLONES int ft_decode_attention(const DecodeAttnArgs* a) {
  const int64_t H = a->H, Hkv = a->Hkv, hd = a->hd, S = a->page_size;
  const int64_t row = (H + 2 * Hkv) * hd, kv_row = Hkv * hd, group = H / Hkv;
  std::vector<float> tmp(hd), scores;
  for (int64_t b = 0; b < a->B; ++b) {
    const int64_t pos = a->positions[b], slot = a->slot_mapping[b], len = a->seq_lens[b];
    if (pos < 0 || pos >= a->max_pos || slot < 0 || slot >= a->n_slots || len < 1 || len > a->P * S) return -1;
    for (int64_t i = 0; i < len; ++i) {  // every page the context reads is in the pool
      const int64_t page = a->block_table[b * a->P + i / S];
      if (page < 0 || (page + 1) * S > a->n_slots) return -1;
    }
  }
  for (int64_t b = 0; b < a->B; ++b) {
    float* q = a->qkv + b * row;
    float* k = q + H * hd;
    const float* v = k + kv_row;
    const float* cos = a->cos + a->positions[b] * a->rot;
    const float* sin = a->sin + a->positions[b] * a->rot;
    for (int64_t h = 0; h < H; ++h) norm_rope(q + h * hd, a->q_norm, a->eps, cos, sin, hd, a->rot, tmp.data());
    for (int64_t h = 0; h < Hkv; ++h) norm_rope(k + h * hd, a->k_norm, a->eps, cos, sin, hd, a->rot, tmp.data());
    const int64_t slot = a->slot_mapping[b];
    for (int64_t i = 0; i < kv_row; ++i) a->k_cache[slot * kv_row + i] = k[i], a->v_cache[slot * kv_row + i] = v[i];
  }
  for (int64_t b = 0; b < a->B; ++b) {  // after every new row is written: sequences may share pages
    const int64_t len = a->seq_lens[b];
    const int64_t lo = a->window > 0 && len > a->window ? len - a->window : 0;
    const int32_t* pages = a->block_table + b * a->P;
    scores.resize(len - lo);
    for (int64_t h = 0; h < H; ++h) {
      const float* q = a->qkv + b * row + h * hd;
      const int64_t g = h / group;
      float mx = -INFINITY;
      for (int64_t p = lo; p < len; ++p) {
        const float* kr = a->k_cache + (pages[p / S] * S + p % S) * kv_row + g * hd;
        const float s = dot(q, kr, hd) * a->scale;
        scores[p - lo] = s;
        mx = s > mx ? s : mx;
      }
      float denom = 0.f;
      for (auto& s : scores) denom += (s = std::exp(s - mx));
      float* o = a->out + b * H * hd + h * hd;
      for (int64_t i = 0; i < hd; ++i) o[i] = 0.f;
      for (int64_t p = lo; p < len; ++p) {
        const float* vr = a->v_cache + (pages[p / S] * S + p % S) * kv_row + g * hd;
        const float pw = scores[p - lo] / denom;
        for (int64_t i = 0; i < hd; ++i) o[i] += pw * vr[i];
      }
    }
  }
  return 0;
}

}  // extern "C"
