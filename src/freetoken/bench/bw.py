"""Host, CPU-kernel and PCIe bandwidths (alone and concurrent); a backend advice; saves the profile."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from freetoken.hardware.bandwidth import BandwidthConfig, BandwidthResult

# Expert sizes the recommendation is printed for (bf16 unless noted; see BENCH.md "Shapes worth knowing").
KNOWN_EXPERTS: dict[str, int] = {
    "Qwen3.5-35B-A3B": 3 * 2048 * 512 * 2,
    "Qwen3.6-35B-A3B-FP8": 3 * 2048 * 512 + 4 * 3 * 16 * 4,  # one byte per weight + the 128x128 block scales
    "Qwen3-30B-A3B": 3 * 2048 * 768 * 2,
    "Qwen3-30B-A3B-FP8": 3 * 2048 * 768 + 6 * 3 * 16 * 4,
    "gpt-oss-20b (MXFP4)": 12_000_000,
}
_GIB = 2**30


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads", type=int, default=None, help="CPU kernel threads (default: physical cores - 1)"
    )
    p.add_argument("--isa", default="auto", help="CPU kernel path: auto, avx2, avx512, avx512bf16, generic")
    p.add_argument(
        "--read-gib", type=float, default=4.0, help="GiB of distinct data for the host read figure"
    )
    p.add_argument("--pool-gib", type=float, default=1.25, help="GiB of experts cycled over (>> L3)")
    p.add_argument("--hidden", type=int, default=2048, help="expert hidden size D (default: Qwen3-30B-A3B)")
    p.add_argument("--inter", type=int, default=768, help="expert intermediate size I")
    p.add_argument("--top-k", type=int, default=8, help="experts per kernel call / per fill batch")
    p.add_argument("--weights", default="bf16", choices=("bf16", "fp8_block", "mxfp4", "nvfp4"),
                   help="the experts' format: B_H and the copies count its packed bytes")  # fmt: skip
    p.add_argument("--layer-experts", type=int, default=128, help="experts per layer (B_P,layer copy size)")
    p.add_argument("--seconds", type=float, default=1.0, help="measurement window per figure")
    p.add_argument("--device", default="cuda", help="copy target: cuda[:N] (skipped without CUDA) or cpu")
    p.add_argument(
        "--expert-mb", type=float, action="append", default=[], help="extra expert size to advise on"
    )
    p.add_argument("--sweep", default=None, metavar="N,N,...|auto",
                   help="measure at each thread count (auto: 2, 4, 6, 8, 12, ... up to physical cores - 1) and "
                   "save the fewest within 3%% of the best miss bandwidth as the engine's default --cpu-threads")
    p.add_argument("--no-save", action="store_true", help="do not save the profile")


def measure_at(cfg: BandwidthConfig, threads: int | None, isa: str = "auto") -> BandwidthResult:
    """``measure`` with a CPU kernel of ``threads`` workers (B_H: the workers' figure, the caller does not help)."""
    from freetoken.experts.cpu.kernel import CpuExpertKernel
    from freetoken.hardware.bandwidth import measure

    kern = CpuExpertKernel(num_threads=threads, isa=isa, caller_helps=False)
    try:
        return measure(cfg, kern)
    finally:
        kern.close()


def sweep_counts(spec: str, physical_cores: int) -> list[int]:
    """``--sweep``'s thread counts: a comma list, or "auto" (2, 4, 6, 8, 12, 16, 24, ... below the physical cores,
    and physical cores - 1)."""
    if spec != "auto":
        counts = [int(t) for t in spec.split(",")]
        if min(counts) < 1:
            raise ValueError(f"--sweep thread counts must be >= 1, got {spec}")
        return sorted(set(counts))
    top = max(1, physical_cores - 1)
    steps = [2, 4, 6, 8, *range(12, top, 4)]
    return sorted({n for n in steps if n < top} | {top})


def _row(name: str, value: float | None, note: str = "") -> str:
    shown = "n/a" if value is None else f"{value:.1f}"
    return f"| {name} | {shown} | {note} |"


def run(args: argparse.Namespace) -> int:
    from freetoken.hardware.bandwidth import BandwidthConfig
    from freetoken.hardware.probe import probe
    from freetoken.hardware.profile import HardwareProfile, miss_gbps, pick_threads, recommend, save_profile

    machine = probe()
    cfg = BandwidthConfig(
        read_bytes=int(args.read_gib * _GIB), pool_bytes=int(args.pool_gib * _GIB), hidden=args.hidden,
        inter=args.inter, top_k=args.top_k, layer_experts=args.layer_experts, seconds=args.seconds, device=args.device,
        weights=args.weights,
    )  # fmt: skip
    counts = sweep_counts(args.sweep, machine.physical_cores) if args.sweep else [args.threads]
    results = {}
    for n in counts:
        r = measure_at(cfg, n, args.isa)
        results[r.threads] = r
    chosen = pick_threads(results) if args.sweep else None
    if args.sweep:
        print("| threads | B_H | B_P' | B_H' | miss GB/s |\n|---|---|---|---|---|")
        for n, r in results.items():
            print(f"| {n}{' (chosen)' if n == chosen else ''} | {r.cpu_kernel:.1f} | {r.fill_concurrent or 0:.1f} "
                  f"| {r.cpu_kernel_concurrent or 0:.1f} | {miss_gbps(r):.1f} |")  # fmt: skip
        print()
    bw = results[chosen] if chosen is not None else next(iter(results.values()))
    profile = HardwareProfile(machine, bw, kernel_threads=chosen)
    gpus = ", ".join(f"{g.name} ({g.vram_total / _GIB:.0f} GiB)" for g in machine.gpus) or "none"
    ram = f"{machine.ram_total / _GIB:.0f} GiB RAM"
    print(f"machine {profile.fingerprint}: {machine.cpu_model}, {machine.physical_cores} cores, {ram},")
    print(f"  {machine.numa_nodes} NUMA node(s), GPU: {gpus}")
    print(f"ISA: {' '.join(machine.isa_flags) or '-'}; kernel: {bw.threads} threads, {bw.isa}")
    mb = bw.expert_bytes / 1e6
    share = bw.cpu_kernel / bw.host_read
    kind = "memcpy (CPU slot pool)" if cfg.device == "cpu" else "pinned H2D"
    both = None if bw.fill_concurrent is None else bw.fill_concurrent + (bw.cpu_kernel_concurrent or 0.0)
    print("| figure | GB/s | what |\n|---|---|---|")
    for line in (
        _row("host read", bw.host_read, f"parallel sum over {args.read_gib:g} GiB, {bw.threads} threads"),
        _row("B_H", bw.cpu_kernel, f"kernel, {mb:.1f} MB {cfg.weights} experts, top-{cfg.top_k}: {share:.0%} of read"),
        _row("B_P,fill", bw.fill, f"{kind} copies of one expert ({mb:.1f} MB), alone"),
        _row("B_P,layer", bw.layer, f"{kind} copy of {cfg.layer_experts} experts at once"),
        _row("B_P'", bw.fill_concurrent, "expert copies while the CPU kernel runs"),
        _row("B_H'", bw.cpu_kernel_concurrent, "CPU kernel while the copies run"),
        _row("B_P' + B_H'", both, "miss bandwidth of the hybrid split"),
    ):
        print(line)
    sizes = dict(KNOWN_EXPERTS)
    sizes.update({f"{s:g} MB": int(s * 1e6) for s in args.expert_mb})
    print("\nrecommendation per expert size:")
    for name, nbytes in sizes.items():
        print(f"- {name} ({nbytes / 1e6:.1f} MB): {recommend(profile, nbytes)}")
    if not args.no_save:
        print(f"\nprofile saved to {save_profile(profile)}")
    return 0
