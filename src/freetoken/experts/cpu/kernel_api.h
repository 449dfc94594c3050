// Shared declarations of the CPU expert kernel: the plan one submitted batch of routes is turned
// into, and the per-ISA phase functions. Plain C++17, no torch headers (called through ctypes).
//
// Shapes: T tokens, D hidden, I expert intermediate, R routes, G distinct pool rows among them,
// N pool rows (eid = layer * E + expert). Banks: gate_up [N, 2I, D] (gate rows, then up rows),
// down [N, D, I]; weights bf16 (uint16 storage), fp32, or fp8 e4m3 with one fp32 scale per 128x128 block
// (FMT_FP8_BLOCK: scale banks gate_up_scale [N, 2I/128, D/128], down_scale [N, D/128, I/128]; D and I whole
// blocks, so a global weight row r's block scales start at scale + (r / 128) * (K / 128)), or FP4 e2m1 nibbles,
// two a byte, low nibble first ([N, rows, K/2] bytes) with per-row scale rows: FMT_MXFP4 one e8m0 byte per 32
// ([N, rows, K/32]); FMT_NVFP4 one e4m3 byte per 16 then the row's fp32 multiplier ([N, rows, K/16 + 4] bytes,
// quant/nvfp4.py). FP4 needs D and I multiples of 32.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ft {

constexpr int64_t kMaxHBlock = 64;  // upper bound of Plan::hblock (stack buffers in phase 1)

enum WeightFormat : int32_t { FMT_F32 = 0, FMT_BF16 = 1, FMT_FP8_BLOCK = 2, FMT_MXFP4 = 3, FMT_NVFP4 = 4 };
constexpr int64_t kFp4Cols = 32;  // FP4 formats: D and I are multiples of this
constexpr int64_t kFp8Block = 128;  // FMT_FP8_BLOCK: rows and columns per scale

// One bank of weight rows and, for a block-scaled format, its scales (null otherwise).
struct Bank {
  const void* w;
  const void* scale;  // fp32 blocks (FMT_FP8_BLOCK) or scale-row bytes (FP4 formats)
};
enum Activation : int32_t { ACT_SILU = 0, ACT_GPTOSS = 1, ACT_GELU_TANH = 2, ACT_DSV4 = 3 };
// Ordered so that ft_best_isa (the highest supported) prefers AVX512-BF16 where a CPU has it.
enum Isa : int32_t {
  ISA_GENERIC = 0, ISA_AVX2 = 1, ISA_AVX2VNNI = 2, ISA_AVX512 = 3, ISA_AVX512VBMI = 4, ISA_AVX512BF16 = 5,
  ISA_COUNT = 6
};

// The operand halves (Plan::x_hi ... h_lo) of FP4 banks on the vdpbf16ps path, in dot_fp4_dp.h's order: within
// each whole 128-element block of a K-element row, element 4j + m sits at 32m + j; elements past the last whole
// block keep their places. Other formats keep element order.
inline int64_t fp4_dp_pos(int64_t k, int64_t K) {
  return k >= (K & ~int64_t{127}) ? k : (k & ~int64_t{127}) | ((k & 3) << 5) | ((k >> 2) & 31);
}
inline bool fp4_format(int32_t fmt) { return fmt == FMT_MXFP4 || fmt == FMT_NVFP4; }

// The int16 operands of FP4 banks on the AVX2 and AVX-512 paths (dot_fp4_avx2i.h, dot_fp4_avx512.h): K values as
// int16 in blocks of 32, each with the fp32 scale s = max |v| / 32767 of its block (v ~= q * s, within s / 2), written
// into Plan::x_q / h_q and x_qs / h_qs (K a multiple of 32). Within each whole 128-element block they lie as
// fp4_dp_pos lays the bf16 halves (element 4j + m at 32m + j); past the last whole block, in 32-blocks with the even
// elements first, then the odd ones (fp4_q16_pos: the 32-code form of the rows' tails, dot_fp4_avx2.h).
// quantize_q16i quantises elements [i0, i0 + n) of a K-element row into the row's q and qs (i0 and n multiples of
// 32), so phase-1 units write their own blocks.
inline int64_t fp4_q16_pos(int64_t k) { return (k & ~int64_t{31}) | ((k & 1) << 4) | ((k & 31) >> 1); }
inline int64_t fp4_q16i_pos(int64_t k, int64_t K) {
  return k >= (K & ~int64_t{127}) ? fp4_q16_pos(k) : fp4_dp_pos(k, K);
}
inline void quantize_q16i(const float* v, int64_t i0, int64_t n, int64_t K, int16_t* q, float* qs) {
  for (int64_t b = 0; b < n; b += 32) {
    float m = 0.f;
    for (int64_t i = b; i < b + 32; ++i) m = v[i] > m ? v[i] : -v[i] > m ? -v[i] : m;
    const float inv = m > 0.f ? 32767.f / m : 0.f;
    qs[(i0 + b) / 32] = m / 32767.f;
    for (int64_t i = b; i < b + 32; ++i)
      q[fp4_q16i_pos(i0 + i, K)] = static_cast<int16_t>(__builtin_lrintf(v[i] * inv));
  }
}

// Built by the submitting thread; workers only read it, except the scratch buffers h and y, where
// every element is written by exactly one worker in one phase and read only in later phases.
struct Plan {
  const float* x;  // [T, D] fp32
  int64_t T, D, I;
  int64_t t0, t1;  // this chunk's tokens [t0, t1): its routes and phase-3 outputs
  Bank gate_up;  // [N, 2I, D] (+ scales)
  Bank down;     // [N, D, I] (+ scales)
  int32_t fmt, act;
  const float* gate_up_bias;  // [N, 2I] fp32 added to gate_up . x before the activation (gpt-oss); null: none
  float* out;  // [T, D] fp32, written (not accumulated) in phase 3
  // Routes sorted by pool row (stable): group g covers sorted positions [group_start[g], group_start[g+1]).
  int64_t R, G;
  const int64_t* group_row;     // [G]
  const int64_t* group_start;   // [G + 1]
  const int32_t* s_tok;         // [R] token of each sorted route
  const float* s_w;             // [R] gate weight of each sorted route
  // Token t0 + j's routes, as sorted positions in ascending order: tok_route[tok_start[j] .. tok_start[j+1]).
  const int64_t* tok_start;  // [t1 - t0 + 1]
  const int64_t* tok_route;  // [R]
  float* h;                  // [R, I] activations of each sorted route
  float* y;                  // [R, D] down projection of each sorted route (unweighted)
  // bf16 hi/lo split of x and h (x ~= hi + lo), only for the vdpbf16ps path; null otherwise.
  uint16_t* x_hi;
  uint16_t* x_lo;  // [T, D]
  uint16_t* h_hi;
  uint16_t* h_lo;  // [R, I]
  // int16 x and h with their block scales (quantize_q16i), FP4 banks on AVX2 / AVX-512; else null.
  int16_t* x_q;   // [T, D]
  float* x_qs;    // [T, D / 32]
  int16_t* h_q;   // [R, I]
  float* h_qs;    // [R, I / 32]
  // Work units (fixed sizes: results must not depend on the thread count).
  int64_t hblock;  // phase 1: h indices per unit; unit = (group, h block)
  int64_t units1;  // G * ceil(I / hblock)
  int64_t dblock;  // phase 2: down rows per unit; unit = (group, row block)
  int64_t units2;  // G * ceil(D / dblock)
  int64_t oblock;  // phase 3: output columns per unit; unit = (token, column block)
  int64_t units3;  // (t1 - t0) * ceil(D / oblock)
  // Batch-1 row blocking: weight rows streamed at once per thread (1, 2 or 4; capped per ISA), a
  // per-kernel setting for FP4 banks and one for the others (ft_pool_set_rows), copied into every plan.
  int64_t rows;
};

// Phase 1: h = act(gate . x, up . x): a unit streams its gate rows, then its up rows (long
//          sequential runs: the hardware prefetcher loses track of interleaved distant rows).
// Phase 2: y = down . h: a unit streams a block of one expert's down rows.
// Phase 3: out[t] = sum of w_s * y_s over t's routes in sorted order (a fixed order per element).
// Operand forms an ISA's phases want written before phase 1 (x) and by phase 1 (h): none (fp32 only), the bf16
// hi/lo split for bf16 and FP4 banks (the vdpbf16ps path), or int16 blocks in quantize_q16i's order for FP4 banks
// (OPERANDS_Q16I_FP4: AVX2, AVX2 with AVX-VNNI, AVX-512, AVX-512 with VBMI).
enum OperandForm : int32_t { OPERANDS_F32 = 0, OPERANDS_BF16 = 1, OPERANDS_Q16I_FP4 = 2 };
inline bool q16_form(int32_t form) { return form == OPERANDS_Q16I_FP4; }

struct IsaOps {
  void (*phase1)(const Plan&, int64_t unit);
  void (*phase2)(const Plan&, int64_t unit);
  void (*phase3)(const Plan&, int64_t unit);
  int32_t operands;  // OperandForm: what the phases read beside the fp32 operands
  uint64_t (*stream_sum)(const uint64_t* p, int64_t words);  // read-bandwidth probe, ISA-vectorised
};

// Defined in isa_<name>.cpp; kernel.cpp only references those the build compiled (FT_HAVE_<ISA>).
IsaOps ops_generic();
IsaOps ops_avx2();
IsaOps ops_avx2vnni();
IsaOps ops_avx512();
IsaOps ops_avx512vbmi();
IsaOps ops_avx512bf16();

// e4m3fn -> fp32, exact (the NaN codes 0x7F/0xFF, which quantisers never write, read as +-480 like the SIMD
// paths' fp16 widening: see the ISA files).
inline float fp8_to_f32(uint8_t v) {
  const uint32_t e = (v >> 3) & 15u, m = v & 7u;
  float f;
  if (e) {
    const uint32_t u = ((e + 120u) << 23) | (m << 20);
    __builtin_memcpy(&f, &u, 4);
  } else {
    f = static_cast<float>(m) * (1.f / 512.f);
  }
  return (v & 0x80u) ? -f : f;
}

inline float bf16_to_f32(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even (finite inputs; activations and hidden states never hold NaN here).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace ft
