"""Every Triton kernel compiles ahead of time for Hopper (sm_90): no GPU needed, Triton ships ptxas."""

from __future__ import annotations

import importlib.util
import os

import pytest


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_triton_kernels_compile_for_hopper() -> None:
    """Every Triton kernel compiles to a cubin for sm_90 (no GPU needed: Triton ships ptxas)."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as exc:  # another Triton layout
        pytest.skip(f"no ahead-of-time compile API: {exc}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter replaces compilation")
    from freetoken.experts.cpu import stage_triton
    from freetoken.experts.slots import copy_triton, gemm_triton, plan_triton

    i64 = "*i64"
    plan_sig = dict.fromkeys(["ids_ptr", "slot_of", "eid_of", "stamp", "tick_ptr", "i64_out", "counters"], i64)
    plan_sig |= dict.fromkeys(["K", "layer_off", "N", "S", "KV", "protect"], "i32")
    plan_sig |= {"locked": "*u8", "share_ptr": "*fp32", "b_out": "*u8"}
    groups = dict.fromkeys(["order", "gstart", "gcount", "gslot", "ngroups_ptr"], i64)
    cases: list[tuple[object, dict[str, str], dict[str, object]]] = [
        (plan_triton._plan_kernel, plan_sig, {"MIN_FILL": 1, "RECENT_LAST": True, "KB": 32, "BS": 512, "COUNT": 2}),
        (plan_triton._plan_kernel, plan_sig, {"MIN_FILL": 0, "RECENT_LAST": False, "KB": 64, "BS": 512, "COUNT": 0}),
        (
            gemm_triton._gate_up_kernel,
            {"x": "*bf16", "gu": "*bf16", "h": "*fp32", **groups},
            {"D": 2048, "I": 768, "TOPK": 8, "BM": 16, "BN": 64, "BK": 64, "PREC": "tf32"},
        ),
        (
            gemm_triton._gate_up_kernel,
            {"x": "*bf16", "gu": "*bf16", "h": "*fp32", **groups},
            {"D": 2880, "I": 2880, "TOPK": 4, "BM": 64, "BN": 64, "BK": 64, "PREC": "tf32"},
        ),
        (
            gemm_triton._down_kernel,
            {"h": "*fp32", "dn": "*fp32", "y": "*fp32", "wts": "*fp32", **groups},
            {"D": 64, "I": 32, "BM": 16, "BN": 64, "BK": 64, "PREC": "ieee"},
        ),
        (
            copy_triton._gather_rows_kernel,
            {"src_gu": "*bf16", "src_dn": "*bf16", "src_gs": "*bf16", "src_ds": "*bf16", "dst_gu": "*bf16",
             "dst_dn": "*bf16", "dst_gs": "*bf16", "dst_ds": "*bf16", "copy_src": i64, "copy_dst": i64,
             "count_ptr": i64},  # fmt: skip
            {"GU": 2 * 768 * 2048, "DN": 768 * 2048, "GS": 0, "DS": 0, "BLOCK": 4096, "ITERS": 8},
        ),
        *FP8_CASES,
        (
            stage_triton._stage_kernel,
            {"x": "*bf16", "codes": i64, "w": "*fp32", "x_dst": "*fp32", "codes_dst": i64, "w_dst": "*fp32",
             "NX": "i32", "NK": "i32"},  # fmt: skip
            {"BLOCK": 1024},
        ),
    ]
    for fn, sig, consts in cases:
        _compile(triton, ASTSource, GPUTarget, fn, sig, consts, 90)


def _compile(triton, ast_source, gpu_target, fn, sig: dict[str, str], consts: dict[str, object], arch: int) -> None:
    """One kernel to a cubin for sm_<arch>."""
    signature: dict[str, str] = {**sig, **{k: "constexpr" for k in consts}}
    src = ast_source(fn=fn, signature=signature, constexprs=consts)
    kernel = triton.compile(src, target=gpu_target("cuda", arch, 32))
    assert "cubin" in kernel.asm


def _fp8_cases() -> list[tuple[object, dict[str, str], dict[str, object]]]:
    """The fp8 grouped GEMM (decode and prefill tiles, bf16 compute) and the four-bank fill of a packed pool."""
    if importlib.util.find_spec("triton") is None:
        return []
    from freetoken.experts.slots import copy_triton, gemm_fp8_triton

    i64 = "*i64"
    groups = dict.fromkeys(["order", "gstart", "gcount", "gslot", "ngroups_ptr"], i64)
    banks = {f"{a}_{b}": "*i32" for a in ("src", "dst") for b in ("gu", "dn", "gs", "ds")}
    return [
        (gemm_fp8_triton._gate_up_fp8_kernel, {"x": "*bf16", "gu": "*u8", "gus": "*fp32", "h": "*fp32", **groups},
         {"D": 2048, "I": 768, "TOPK": 8, "BM": 16, "BN": 32, "BK": 128, "DT": 1, "PREC": "tf32"}),
        (gemm_fp8_triton._gate_up_fp8_kernel, {"x": "*bf16", "gu": "*u8", "gus": "*fp32", "h": "*fp32", **groups},
         {"D": 2048, "I": 512, "TOPK": 8, "BM": 64, "BN": 64, "BK": 64, "DT": 1, "PREC": "tf32"}),
        (gemm_fp8_triton._down_fp8_kernel,
         {"h": "*fp32", "dn": "*u8", "dns": "*fp32", "y": "*fp32", "wts": "*fp32", **groups},
         {"D": 2048, "I": 768, "BM": 16, "BN": 64, "BK": 64, "DT": 1, "PREC": "tf32"}),
        (copy_triton._gather_rows_kernel, {**banks, "copy_src": i64, "copy_dst": i64, "count_ptr": i64},
         {"GU": 768 * 2048 // 2, "DN": 768 * 2048 // 4, "GS": 12 * 16, "DS": 16 * 6, "BLOCK": 4096, "ITERS": 8}),
    ]  # fmt: skip


FP8_CASES = _fp8_cases()


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.parametrize("arch", [86, 89, 120])
def test_fp8_kernels_compile_beyond_hopper(arch: int) -> None:
    """The fp8 kernels use integer ops and an fp16 bitcast only: they build for Ampere, Ada and Blackwell too."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError as exc:
        pytest.skip(f"no ahead-of-time compile API: {exc}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter replaces compilation")
    for fn, sig, consts in FP8_CASES:
        _compile(triton, ASTSource, GPUTarget, fn, sig, consts, arch)
