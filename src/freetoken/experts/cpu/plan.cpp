// See plan.h.
#include "plan.h"

#include <algorithm>

namespace ft {
namespace {

constexpr int64_t kHBlock = 16;   // h indices per phase-1 unit: 2 runs of 16 rows (2 x 64 KiB at D=2048 bf16)
constexpr int64_t kDBlock = 32;   // down rows per phase-2 unit (48 KiB at I=768 bf16)
constexpr int64_t kOBlock = 512;  // output columns per phase-3 unit
// fp8 rows are half a bf16 row's bytes: twice the rows per unit keep a unit's contiguous runs as long (the
// prefetcher's ramp per run) and halve the per-unit operand scaling
constexpr int64_t kHBlockFp8 = 2 * kHBlock, kDBlockFp8 = 2 * kDBlock;
// FP4 rows are a quarter of a bf16 row's bytes (plus scale rows): four times the rows, for the same reason
constexpr int64_t kHBlockFp4 = 4 * kHBlock, kDBlockFp4 = 4 * kDBlock;
static_assert(kHBlockFp4 <= kMaxHBlock, "phase 1 keeps a block of gate/up values on the stack");
static_assert(kHBlockFp4 % 32 == 0, "a phase-1 unit quantises whole 32-blocks of h (quantize_q16i)");
static_assert(kHBlockFp8 <= kMaxHBlock, "phase 1 keeps a block of gate/up values on the stack");
static_assert(kFp8Block % kHBlockFp8 == 0 && kFp8Block % kDBlockFp8 == 0, "a phase unit's rows share one fp8 block row");

int check(const FtMoeArgs& a) {
  if (a.T < 0 || a.D <= 0 || a.I <= 0 || a.R < 0 || a.N < 0 || (a.T > 0 && (!a.x || !a.out))) return -2;
  if (a.R > 0 && (!a.tok || !a.row || !a.w || !a.gate_up || !a.down)) return -2;
  for (int64_t s = 0; s < a.R; ++s) {
    if (a.tok[s] < 0 || a.tok[s] >= a.T) return -3;
    if (a.row[s] < 0 || a.row[s] >= a.N) return -4;
  }
  if (a.fmt < FMT_F32 || a.fmt > FMT_NVFP4 || a.act < ACT_SILU || a.act > ACT_DSV4) return -5;
  if (a.fmt == FMT_FP8_BLOCK && (!a.gate_up_scale || !a.down_scale || a.D % kFp8Block || a.I % kFp8Block)) return -2;
  const bool fp4 = fp4_format(a.fmt);
  if (fp4 && (!a.gate_up_scale || !a.down_scale || a.D % kFp4Cols || a.I % kFp4Cols)) return -2;
  return 0;
}

}  // namespace

int PlanBuilder::build(const FtMoeArgs& a, int32_t operands) {
  if (const int rc = check(a)) return rc;
  const int64_t T = a.T, R = a.R;
  // bucket routes by token, keeping submission order within a token (counting sort)
  tok_begin_.assign(T + 1, 0);
  for (int64_t s = 0; s < R; ++s) ++tok_begin_[a.tok[s] + 1];
  for (int64_t t = 0; t < T; ++t) tok_begin_[t + 1] += tok_begin_[t];
  order_.assign(tok_begin_.begin(), tok_begin_.end() - 1);
  by_tok_.resize(R);
  for (int64_t s = 0; s < R; ++s) by_tok_[order_[a.tok[s]]++] = s;
  // cut into chunks of whole tokens with at most kMaxChunkRoutes routes (at least one token each)
  plans_.clear();
  int64_t max_routes = 0;
  for (int64_t t0 = 0; t0 < T;) {
    int64_t t1 = t0 + 1;
    while (t1 < T && tok_begin_[t1 + 1] - tok_begin_[t0] <= kMaxChunkRoutes) ++t1;
    if (store_.size() <= plans_.size()) store_.emplace_back();
    plans_.emplace_back();
    build_chunk(a, t0, t1, store_[plans_.size() - 1], plans_.back());
    max_routes = std::max(max_routes, tok_begin_[t1] - tok_begin_[t0]);
    t0 = t1;
  }
  const bool fp4 = fp4_format(a.fmt);
  split_ = R == 0                                                             ? OPERANDS_F32
           : operands == OPERANDS_BF16 && (a.fmt == FMT_BF16 || fp4)           ? OPERANDS_BF16
           : q16_form(operands) && fp4                                         ? operands
                                                                               : OPERANDS_F32;
  h_.resize(max_routes * a.I);
  y_.resize(max_routes * a.D);
  if (split_ == OPERANDS_BF16)
    x_hi_.resize(T * a.D), x_lo_.resize(T * a.D), h_hi_.resize(max_routes * a.I), h_lo_.resize(max_routes * a.I);
  if (q16_form(split_))
    x_q_.resize(T * a.D), x_qs_.resize(T * a.D / 32), h_q_.resize(max_routes * a.I), h_qs_.resize(max_routes * a.I / 32);
  for (Plan& p : plans_) {  // scratch pointers last: the vectors above may have moved
    p.h = h_.data(), p.y = y_.data(), p.rows = fp4 ? rows_fp4_ : rows_;
    if (split_ == OPERANDS_BF16) p.x_hi = x_hi_.data(), p.x_lo = x_lo_.data(), p.h_hi = h_hi_.data(), p.h_lo = h_lo_.data();
    if (q16_form(split_)) p.x_q = x_q_.data(), p.x_qs = x_qs_.data(), p.h_q = h_q_.data(), p.h_qs = h_qs_.data();
  }
  return 0;
}

void PlanBuilder::build_chunk(const FtMoeArgs& a, int64_t t0, int64_t t1, Chunk& c, Plan& p) {
  // this chunk's routes, sorted by pool row; ties keep (token, submission) order
  const int64_t b = tok_begin_[t0], R = tok_begin_[t1] - b;
  order_.assign(by_tok_.begin() + b, by_tok_.begin() + b + R);
  std::stable_sort(order_.begin(), order_.end(), [&a](int64_t i, int64_t j) { return a.row[i] < a.row[j]; });
  c.s_tok.resize(R), c.s_w.resize(R), c.group_row.clear(), c.group_start.clear();
  for (int64_t s = 0; s < R; ++s) {
    const int64_t r = order_[s];
    c.s_tok[s] = a.tok[r], c.s_w[s] = a.w[r];
    if (s == 0 || a.row[r] != c.group_row.back()) c.group_row.push_back(a.row[r]), c.group_start.push_back(s);
  }
  c.group_start.push_back(R);
  // chunk token (t - t0) -> its sorted positions, ascending (counting sort: stable)
  c.tok_start.assign(t1 - t0 + 1, 0);
  for (int64_t s = 0; s < R; ++s) ++c.tok_start[c.s_tok[s] - t0 + 1];
  for (int64_t t = 0; t < t1 - t0; ++t) c.tok_start[t + 1] += c.tok_start[t];
  std::vector<int64_t> next(c.tok_start.begin(), c.tok_start.end() - 1);
  c.tok_route.resize(R);
  for (int64_t s = 0; s < R; ++s) c.tok_route[next[c.s_tok[s] - t0]++] = s;
  p = Plan{};
  p.x = a.x, p.T = a.T, p.D = a.D, p.I = a.I, p.t0 = t0, p.t1 = t1;
  p.gate_up = Bank{a.gate_up, a.gate_up_scale}, p.down = Bank{a.down, a.down_scale}, p.fmt = a.fmt, p.act = a.act, p.out = a.out;
  p.gate_up_bias = a.gate_up_bias;
  p.R = R, p.G = static_cast<int64_t>(c.group_row.size());
  p.group_row = c.group_row.data(), p.group_start = c.group_start.data();
  p.s_tok = c.s_tok.data(), p.s_w = c.s_w.data();
  p.tok_start = c.tok_start.data(), p.tok_route = c.tok_route.data();
  const bool fp8 = a.fmt == FMT_FP8_BLOCK, fp4 = fp4_format(a.fmt);
  p.hblock = fp4 ? kHBlockFp4 : fp8 ? kHBlockFp8 : kHBlock, p.units1 = p.G * ((a.I + p.hblock - 1) / p.hblock);
  p.dblock = fp4 ? kDBlockFp4 : fp8 ? kDBlockFp8 : kDBlock, p.units2 = p.G * ((a.D + p.dblock - 1) / p.dblock);
  p.oblock = kOBlock, p.units3 = (t1 - t0) * ((a.D + kOBlock - 1) / kOBlock);
}

}  // namespace ft
