"""Every Triton kernel compiles ahead of time for the GPUs our users own and the box we measure on:
Ampere (sm_86), Ada (sm_89), Hopper (sm_90) and Blackwell consumer cards (sm_120). No GPU needed:
Triton ships ptxas."""

from __future__ import annotations

import importlib.util
import os

import pytest


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.parametrize("arch", [86, 89, 90, 120])
def test_triton_kernels_compile(arch: int) -> None:
    """Every Triton kernel compiles to a cubin for ``sm_<arch>``."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as exc:  # another Triton layout
        pytest.skip(f"no ahead-of-time compile API: {exc}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter replaces compilation")
    from freetoken.experts.cpu import stage_triton
    from freetoken.experts.slots import copy_triton, gemm_fp4_triton, gemm_fp8_triton, gemm_triton, plan_triton
    from freetoken.kernels import (
        deltanet_triton,
        draw_triton,
        logprobs_triton,
        norm_triton,
        nucleus_triton,
        penalty_triton,
        router_triton,
        topk_triton,
    )
    from freetoken.kernels.attention import qkv_rope_triton, triton_decode, triton_prefill

    i64 = "*i64"
    plan_ptrs = ["ids_ptr", "slot_of", "eid_of", "stamp", "tick_ptr", "i64_out", "counters", "layer_counters"]
    plan_sig = dict.fromkeys(plan_ptrs, i64)
    plan_sig |= dict.fromkeys(["K", "layer_off", "N", "S", "KV", "protect", "fill_rows"], "i32")
    plan_sig |= {"locked": "*u8", "share_ptr": "*fp32", "b_out": "*u8"}
    groups = dict.fromkeys(["order", "gstart", "gcount", "gslot", "ngroups_ptr"], i64)
    grouping = {"ids": i64, "K": "i32", "layer_off": "i32", "n_rows": "i32", "tables": i64, "valid_out": "*u8",
                "geid": i64, "bias": "*fp32"}  # fmt: skip
    cases: list[tuple[object, dict[str, str], dict[str, object]]] = [
        (plan_triton._plan_kernel, plan_sig, {"MIN_FILL": 1, "RECENT_LAST": True, "KB": 32, "BS": 512, "COUNT": 2}),
        (plan_triton._plan_kernel, plan_sig, {"MIN_FILL": 0, "RECENT_LAST": False, "KB": 64, "BS": 512, "COUNT": 0}),
        (
            gemm_triton._gate_up_kernel,
            {"x": "*bf16", "gu": "*bf16", "h": "*fp32", **groups, **grouping},
            {"D": 2048, "I": 768, "TOPK": 8, "BM": 16, "BN": 64, "BK": 64, "PREC": "tf32", "GROUP": True, "KB": 32},
        ),
        (
            gemm_triton._gate_up_kernel,
            {"x": "*bf16", "gu": "*bf16", "h": "*fp32", **groups, **grouping},
            {"D": 2880, "I": 2880, "TOPK": 4, "BM": 64, "BN": 64, "BK": 64, "PREC": "tf32", "GROUP": False, "KB": 1},
        ),
        (  # gpt-oss's experts: gate/up biases by eid, the clamped activation
            gemm_triton._gate_up_kernel,
            {"x": "*bf16", "gu": "*bf16", "h": "*fp32", **groups, **grouping},
            {"D": 2880, "I": 2880, "TOPK": 4, "BM": 16, "BN": 32, "BK": 128, "PREC": "tf32", "GROUP": True, "KB": 16,
             "HAS_BIAS": True, "ACT": 1},  # fmt: skip
        ),
        (  # DeepSeek-V4's experts: the clamped SiLU
            gemm_triton._gate_up_kernel,
            {"x": "*bf16", "gu": "*bf16", "h": "*fp32", **groups, **grouping},
            {"D": 4096, "I": 2048, "TOPK": 6, "BM": 16, "BN": 32, "BK": 128, "PREC": "tf32", "GROUP": True, "KB": 16,
             "ACT": 3},  # fmt: skip
        ),
        (  # Gemma-4's experts: the GELU(tanh)-gated activation
            gemm_triton._gate_up_kernel,
            {"x": "*bf16", "gu": "*bf16", "h": "*fp32", **groups, **grouping},
            {"D": 2816, "I": 704, "TOPK": 8, "BM": 16, "BN": 64, "BK": 64, "PREC": "tf32", "GROUP": True, "KB": 32,
             "ACT": 2},  # fmt: skip
        ),
        (
            gemm_triton._down_kernel,
            {"h": "*fp32", "dn": "*fp32", "y": "*fp32", "wts": "*fp32", **groups, "out": "*fp32", "route_group": i64,
             "tickets": "*i32", "T": "i32"},  # fmt: skip
            {"D": 64, "I": 32, "BM": 16, "BN": 64, "BK": 64, "PREC": "ieee", "TOPK": 2, "COMBINE": True, "BT": 4,
             "BKP": 2},  # fmt: skip
        ),
        (
            copy_triton._gather_rows_kernel,
            {**{f"{a}_{b}": "*bf16" for a in ("src", "dst") for b in ("gu", "dn", "gs", "ds")}, "copy_src": i64,
             "copy_dst": i64, "count_ptr": i64},  # fmt: skip
            {"GU": 2 * 768 * 2048, "DN": 768 * 2048, "GS": 0, "DS": 0, "BLOCK": 4096, "ITERS": 8},
        ),
        # a packed pool's fill (fp8 weights and fp32 scales as int32 words) and the fp8 GEMM, decode and prefill tiles
        (
            copy_triton._gather_rows_kernel,
            {**{f"{a}_{b}": "*i32" for a in ("src", "dst") for b in ("gu", "dn", "gs", "ds")}, "copy_src": i64,
             "copy_dst": i64, "count_ptr": i64},  # fmt: skip
            {"GU": 768 * 2048 // 2, "DN": 768 * 2048 // 4, "GS": 12 * 16, "DS": 16 * 6, "BLOCK": 4096, "ITERS": 8},
        ),
        (
            gemm_fp8_triton._gate_up_fp8_kernel,
            {"x": "*bf16", "gu": "*u8", "gus": "*fp32", "h": "*fp32", **groups},
            {"D": 2048, "I": 768, "TOPK": 8, "BM": 16, "BN": 32, "BK": 128, "DT": 1, "PREC": "tf32"},
        ),
        (
            gemm_fp8_triton._gate_up_fp8_kernel,
            {"x": "*bf16", "gu": "*u8", "gus": "*fp32", "h": "*fp32", **groups},
            {"D": 2048, "I": 512, "TOPK": 8, "BM": 64, "BN": 64, "BK": 64, "DT": 1, "PREC": "tf32"},
        ),
        (
            gemm_fp8_triton._down_fp8_kernel,
            {"h": "*fp32", "dn": "*u8", "dns": "*fp32", "y": "*fp32", "wts": "*fp32", **groups},
            {"D": 2048, "I": 768, "BM": 16, "BN": 64, "BK": 64, "DT": 1, "PREC": "tf32"},
        ),
        # the FP4 GEMM (MXFP4 = KIND 0, NVFP4 = KIND 1: uint8 weights and scale rows), decode and prefill tiles
        (
            gemm_fp4_triton._gate_up_fp4_kernel,
            {"x": "*bf16", "gu": "*u8", "gus": "*u8", "h": "*fp32", **groups},
            {"D": 2048, "I": 768, "TOPK": 8, "BM": 16, "BN": 32, "BK": 128, "DT": 1, "PREC": "tf32", "KIND": 1,
             "SROW": 2048 // 16 + 4},  # fmt: skip
        ),
        (
            gemm_fp4_triton._gate_up_fp4_kernel,
            {"x": "*bf16", "gu": "*u8", "gus": "*u8", "h": "*fp32", **groups},
            {"D": 2880, "I": 2880, "TOPK": 4, "BM": 64, "BN": 64, "BK": 64, "DT": 1, "PREC": "tf32", "KIND": 0,
             "SROW": 2880 // 32},  # fmt: skip
        ),
        (
            gemm_fp4_triton._down_fp4_kernel,
            {"h": "*fp32", "dn": "*u8", "dns": "*u8", "y": "*fp32", "wts": "*fp32", **groups},
            {"D": 2048, "I": 768, "BM": 16, "BN": 64, "BK": 64, "DT": 1, "PREC": "tf32", "KIND": 1,
             "SROW": 768 // 16 + 4},  # fmt: skip
        ),
        (
            stage_triton._stage_kernel,
            {"x": "*bf16", "codes": i64, "w": "*fp32", "x_dst": "*fp32", "codes_dst": i64, "w_dst": "*fp32",
             "NX": "i32", "NK": "i32"},  # fmt: skip
            {"BLOCK": 1024},
        ),
    ]
    attn = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "BT": "*i32", "LENS": "*i32", "ACC": "*fp32", "MAX": "*fp32",
            "SUM": "*fp32", "OUT": "*bf16", "CNT": "*i32", "POS": i64, "SLOT": i64, "COS": "*fp32", "SIN": "*fp32",
            "QW": "*bf16", "KW": "*bf16", "SINKS": "*fp32", "scale": "fp32", "window": "i32",
            "eps": "fp32"}  # fmt: skip
    strides = ("qb", "qh", "kt", "kh", "vt", "vh", "bt", "ab", "ah", "as", "ob", "oh")
    attn |= dict.fromkeys([f"stride_{n}" for n in strides], "i32")
    for hd, g, window, splits, rope, sinks in ((128, 8, False, 32, True, False), (64, 1, True, 8, False, False),
                                               (256, 2, False, 1, True, False), (64, 8, True, 8, True, True),
                                               (64, 8, False, 1, False, True)):  # fmt: skip
        consts = {"PAGE": 16, "G": g, "BLOCK_G": 16, "HD": hd, "BLOCK_N": 32, "SPLITS": splits,
                  "BLOCK_S": max(2, splits), "HAS_WINDOW": window, "ROPE": rope, "H": 4 * g, "ROT": hd // 2 if window
                  else hd, "HAS_QN": rope, "HAS_KN": rope, "HAS_SINKS": sinks}  # fmt: skip
        consts["PREC"] = "tf32"
        tables = {"BT": i64, "LENS": i64} if rope else {}  # the step graph's int64 rows, read in place
        cases.append((triton_decode._paged_decode_kernel, {**attn, **tables}, consts))
    norm = {"X": "*bf16", "D": "*bf16", "W": "*bf16", "H": "*bf16", "Y": "*bf16", "N": "i32", "eps": "fp32",
            "stride": "i32"}  # fmt: skip
    for add, block in ((True, 2048), (False, 128)):
        cases.append((norm_triton._rms_norm_kernel, norm, {"HAS_ADD": add, "BLOCK": block, "GATHER": False}))
    cases.append((norm_triton._rms_norm_kernel, {**norm, "D": i64}, {"HAS_ADD": False, "BLOCK": 2048, "GATHER": True}))
    # the decode step's small fused kernels: q/k norm + rotary + KV write, the experts' combine, router, grouping
    qkv = {"QKV": "*bf16", "POS": i64, "SLOT": i64, "COS": "*fp32", "SIN": "*fp32", "QW": "*bf16", "KW": "*bf16",
           "QOUT": "*bf16", "KC": "*bf16", "VC": "*bf16", "stride_t": "i32", "stride_kc": "i32", "stride_vc": "i32",
           "eps": "fp32"}  # fmt: skip
    for hd, rot, norms in ((128, 128, True), (256, 64, True), (64, 64, False)):
        consts = {"H": 32, "HKV": 4, "HD": hd, "ROT": rot, "HAS_QN": norms, "HAS_KN": norms}
        cases.append((qkv_rope_triton._qkv_rope_kernel, qkv, consts))
    down = {"h": "*fp32", "dn": "*bf16", "y": "*fp32", "wts": "*fp32", **groups, "out": "*bf16", "route_group": i64,
            "tickets": "*i32", "T": "i32"}  # fmt: skip
    tiles = {"D": 2048, "I": 768, "BM": 16, "BN": 64, "BK": 64, "PREC": "tf32", "TOPK": 8}
    for fold, bt in ((True, 4), (False, 1)):
        cases.append((gemm_triton._down_kernel, down, {**tiles, "COMBINE": fold, "BT": bt, "BKP": 8 if fold else 1}))
    combine = {"y": "*fp32", "out": "*bf16", "route_group": i64, "gslot": i64, "ngroups_ptr": i64}
    cases.append((gemm_triton._combine_kernel, combine, {"D": 2048, "TOPK": 8, "BN": 256}))
    route = {"L": "*bf16", "IDS": i64, "W": "*fp32", "E": "i32"}
    for e, k in ((128, 8), (512, 10)):
        consts = {"K": k, "BLOCK_E": e, "BLOCK_K": 16 if k > 8 else 8, "NORM": True, "ACT": triton.language.bfloat16}
        cases.append((router_triton._route_kernel, route, consts))
    lroute = {"X": "*bf16", "RW": "*bf16", "L": "*fp32", "IDS": i64, "W": "*fp32", "TK": "*i32", "T": "i32", "E": "i32",
              "D": "i32"}  # fmt: skip
    for e, k in ((128, 8), (512, 10)):
        consts = {"K": k, "BT": 16, "BE": 16, "BD": 128, "KS": 4, "BLOCK_E": e, "BLOCK_K": 16 if k > 8 else 8,
                  "NORM": True, "ACT": triton.language.bfloat16, "PREC": "tf32", "BTT": 2}  # fmt: skip
        cases.append((router_triton._linear_route_kernel, lroute, consts))
    grp = {"ids_ptr": i64, "K": "i32", "layer_off": "i32", "N": "i32", "i64_out": i64, "b_out": "*u8"}
    cases.append((plan_triton._group_kernel, grp, {"KB": 32}))
    pre = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "O": "*bf16", "BT": "*i32", "QSTART": "*i32", "QLEN": "*i32",
           "CTX": "*i32", "SINKS": "*fp32", "scale": "fp32", "window": "i32"}  # fmt: skip
    pre |= dict.fromkeys([f"stride_{n}" for n in ("qt", "qh", "kt", "kh", "vt", "vh", "ot", "oh", "bt")], "i32")
    for hd, window, sinks in ((128, False, False), (64, True, False), (256, False, False), (64, True, True)):
        consts = {"PAGE": 16, "G": 8, "HD": hd, "BLOCK_M": 32, "BLOCK_N": 32, "HAS_WINDOW": window, "PREC": "tf32",
                  "HAS_SINKS": sinks}  # fmt: skip
        cases.append((triton_prefill._paged_prefill_kernel, pre, consts))
    # the gated DeltaNet decode step (Qwen3.6's layer; a tiny GVA one with two dv blocks) and its gated norm
    step = {"Mixed": "*bf16", "Bg": "*bf16", "Ag": "*bf16", "stride_x": "i32", "Conv": "*bf16", "Ssm": "*fp32",
            "Wc": "*bf16", "Alog": "*fp32", "Dtb": "*fp32", "Slots": i64, "Pos": i64, "Arrive": "*i32",
            "Core": "*bf16", "scale": "fp32"}  # fmt: skip
    for hk, h, dk, dv, bv, bb in ((16, 32, 128, 128, 32, 1), (1, 2, 16, 16, 8, 4)):
        consts = {"H": h, "HK": hk, "DK": dk, "DV": dv, "KW": 4, "KP": 4, "BK": dk, "BV": bv, "NV": dv // bv, "BB": bb}
        cases.append((deltanet_triton._deltanet_step_kernel, step, consts))
    gnorm = {"X": "*fp32", "Z": "*bf16", "W": "*bf16", "Y": "*bf16", "N": "i32", "eps": "fp32", "sx_t": "i32",
             "sx_h": "i32", "sz_t": "i32", "sz_h": "i32", "HEADS": "i32"}  # fmt: skip
    cases.append((norm_triton._gated_rms_norm_kernel, gnorm, {"BLOCK": 128}))
    # the sampler's draw (Qwen's vocabulary of 151,936: 75 blocks of 2048)
    parts = {"V": "i32", "stride": "i32", "NB": "i32"}
    cases.append((draw_triton._max_kernel, {"X": "*fp32", "PM": "*fp32", "PI": "*i32", **parts}, {"BLOCK": 2048}))
    draw = {"X": "*fp32", "T": "*fp32", "LO": i64, "HI": i64, "STEP": i64, "PM": "*fp32", "DM": "*fp32",
            "DI": "*i32", **parts}  # fmt: skip
    for unit in (False, True):
        cases.append((draw_triton._draw_kernel, draw, {"NB_POW": 128, "BLOCK": 2048, "PRECISE": True, "UNIT": unit}))
    pick = {"T": "*fp32", "PM": "*fp32", "PI": "*i32", "DM": "*fp32", "DI": "*i32", "OUT": i64, "V": "i32",
            "NB": "i32"}  # fmt: skip
    for unit in (False, True):
        cases.append((draw_triton.pick_kernel, pick, {"NB_POW": 128, "UNIT": unit}))
    # its top-p / min-p cut without a sort: the first, a middle and the masking pass (writing the cut, or drawing)
    hist = {"X": "*fp32", "T": "*fp32", "TP": "*fp32", "PH": "*fp32", "PC": "*i32", "PM": "*fp32", "SP": i64,
            "SA": "*fp32", "SS": "*fp32", "V": "i32", "stride": "i32", "B": "i32", "NB": "i32"}  # fmt: skip
    nb = {"NB_POW": 256, "BLOCK": nucleus_triton.BLOCK}  # the default launch at V = 151,936 (149 blocks)
    for level in (0, 1, 5):
        cases.append((nucleus_triton._level_kernel, hist, {"LEVEL": level, **nb}))
    mask = {**hist, "MP": "*fp32", "OUT": "*fp32", "LO": i64, "HI": i64, "STEP": i64, "XM": "*fp32", "XI": "*i32",
            "DM": "*fp32", "DI": "*i32"}  # fmt: skip
    order = ["X", "T", "TP", "MP", "PH", "PC", "PM", "SP", "SA", "SS", "OUT", "LO", "HI", "STEP", "XM", "XI", "DM",
             "DI", "V", "stride", "B", "NB"]  # fmt: skip
    for draw in (False, True):
        cases.append((nucleus_triton._mask_kernel, {k: mask[k] for k in order}, {**nb, "DRAW": draw, "PRECISE": True}))
    # its top-k cut and draw: the blocks' K best, then each row's cut (and draw) at K = 32 (Qwen's top-k 20)
    blk = {"X": "*fp32", "CV": "*fp32", "CI": "*i32", "PM": "*fp32", "PS": "*fp32", "V": "i32", "stride": "i32",
           "NB": "i32"}  # fmt: skip
    for lse in (False, True):
        cases.append((topk_triton.block_topk_kernel, blk, {"K": 32, "BLOCK": topk_triton.BLOCK, "LSE": lse}))
    row = {"CV": "*fp32", "CI": "*i32", "T": "*fp32", "TK": i64, "TP": "*fp32", "MP": "*fp32", "LO": i64, "HI": i64,
           "STEP": i64, "ZK": "*fp32", "IK": "*i32", "OUT": i64, "V": "i32", "NC": "i32"}  # fmt: skip
    for draw in (False, True):
        cases.append((topk_triton._row_kernel, row, {"K": 32, "NC_POW": 2048, "PRECISE": True, "DRAW": draw}))
    lp = {"X": "*fp32", "IDS": i64, "CV": "*fp32", "CI": "*i32", "PM": "*fp32", "PS": "*fp32", "LP": "*fp32",
          "TV": "*fp32", "TI": i64, "V": "i32", "stride": "i32", "NB": "i32", "NC": "i32"}  # fmt: skip
    cases.append((logprobs_triton._row_kernel, lp, {"K": 32, "NC_POW": 2048, "NB_POW": 64}))
    pen = {"X": "*fp32", "C": "*i32", "S": "*u8", "ROWS": i64, "REP": "*fp32", "PRES": "*fp32", "FREQ": "*fp32",
           "OUT": "*fp32", "V": "i32", "stride": "i32"}  # fmt: skip
    cases.append((penalty_triton._penalty_kernel, pen, {"BLOCK": penalty_triton.BLOCK}))
    for fn, sig, consts in cases:
        signature: dict[str, str] = {**sig, **{k: "constexpr" for k in consts}}
        src = ASTSource(fn=fn, signature=signature, constexprs=consts)
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32))
        assert "cubin" in kernel.asm
