// Turning one submitted batch of routes into work plans: routes are bucketed by token, cut into
// chunks of consecutive tokens with at most kMaxChunkRoutes routes (bounds the h/y scratch for big
// batches), and within a chunk sorted by pool row. Plain C++17, no ISA flags.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "kernel_api.h"

extern "C" struct FtMoeArgs {
  const float* x;  // [T, D] fp32
  int64_t T, D, I;
  const int32_t* tok;  // [R]
  const int64_t* row;  // [R] pool rows
  const float* w;      // [R]
  int64_t R;
  const void* gate_up;  // [N, 2I, D]
  const void* down;     // [N, D, I]
  int64_t N;
  int32_t fmt, act;
  float* out;  // [T, D] fp32
  const void* gate_up_scale;  // FMT_FP8_BLOCK: fp32 [N, 2I/128, D/128]; FP4: scale rows (kernel_api.h); else null
  const void* down_scale;     // [N, D/128, I/128] fp32, or FP4 scale rows
  const float* gate_up_bias;   // [N, 2I] fp32 (gate half, then up half); null: no bias
};

namespace ft {

// Scratch whose rows SIMD loads read whole cache lines of: 64-byte aligned. Contents are not kept
// across resize (they are rewritten every batch).
template <class T>
class AlignedBuf {
 public:
  AlignedBuf() = default;
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  ~AlignedBuf() { release(); }
  void resize(size_t n) {
    if (n <= cap_) return;
    release();
    p_ = static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64)));
    cap_ = n;
  }
  T* data() { return p_; }

 private:
  void release() {
    if (p_) ::operator delete(p_, std::align_val_t(64));
    p_ = nullptr, cap_ = 0;
  }
  T* p_ = nullptr;
  size_t cap_ = 0;
};

// A token's output is the same bits whether or not the batch is chunked: its routes are summed in
// (pool row, submission index) order either way.
constexpr int64_t kMaxChunkRoutes = 4096;

class PlanBuilder {
 public:
  // Checks `a` and builds the chunk plans. 0, or the error codes of ft_moe_submit (-2 .. -5).
  int build(const FtMoeArgs& a, int32_t operands);

  const std::vector<Plan>& chunks() const { return plans_; }
  // The operand form of x the workers write before phase 1 (OPERANDS_F32: none; the plans point at it)
  int32_t split() const { return split_; }
  uint16_t* x_hi() { return x_hi_.data(); }
  uint16_t* x_lo() { return x_lo_.data(); }
  int16_t* x_q() { return x_q_.data(); }
  float* x_qs() { return x_qs_.data(); }
  void set_rows(int64_t rows, int64_t rows_fp4) { rows_ = rows, rows_fp4_ = rows_fp4; }  // Plan::rows from now on

 private:
  struct Chunk {  // storage behind one Plan
    std::vector<int64_t> group_row, group_start, tok_start, tok_route;
    std::vector<int32_t> s_tok;
    std::vector<float> s_w;
  };
  void build_chunk(const FtMoeArgs& a, int64_t t0, int64_t t1, Chunk& c, Plan& p);

  std::vector<int64_t> by_tok_, tok_begin_, order_;  // routes bucketed by token (stable)
  std::vector<Chunk> store_;
  std::vector<Plan> plans_;
  AlignedBuf<float> h_, y_;  // scratch shared by the chunks (run one after another)
  AlignedBuf<uint16_t> x_hi_, x_lo_, h_hi_, h_lo_;
  AlignedBuf<int16_t> x_q_, h_q_;
  AlignedBuf<float> x_qs_, h_qs_;
  int32_t split_ = OPERANDS_F32;
  int64_t rows_ = 1, rows_fp4_ = 1;
};

}  // namespace ft
