"""Does the memory plan add up to what the device shows taken? For each preset (the ``ft bench e2e`` synthetic
checkpoints, 12 layers by default) and each budget (``none``: no ``--vram-budget``), in a fresh process each: the
engine is built, the plan's table printed, and the device's taken bytes compared with the plan's held shares:

  context   = total - free after a first CUDA allocation, before the engine (the CUDA context, other programs)
  taken     = total - free once the engine is built (``torch.cuda.mem_get_info``)
  held      = the plan's shares held on the device (weights, experts, slots, KV pages, states, checkpoints)
  taken - context - held  should be within 256 MiB (issue #33); torch's reserved/allocated bytes are printed too
  (the caches allocate outside torch's caching allocator where the driver API is there: ``device_zeros``).

Then one short generation, and the same numbers again (the activations and graphs come out of the reserve).

  python bench/gpu/memory_plan.py [--presets qwen3-30b-a3b,qwen3.6-35b-a3b] [--budgets none,20] [--layers 12]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

MIB, GIB = 1 << 20, 1 << 30
SLACK = 256 * MIB


def _taken() -> int:
    import torch

    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def one(preset: str, budget: str, layers: int, backend: str) -> int:
    import torch

    from freetoken import LLM, SamplingParams
    from freetoken.bench.e2e import checkpoint

    path = checkpoint(argparse.Namespace(model=None, preset=preset, dir=None, layers=layers))
    torch.zeros(1, device="cuda")  # the CUDA context
    context = _taken()
    kw = {} if budget == "none" else {"vram_budget": float(budget)}
    llm = LLM(str(path), device="cuda", dtype="bfloat16", moe_backend=backend, **kw)
    plan = llm.engine.memory.plan
    print(f"## {preset}, {layers} layers, backend {backend}, --vram-budget {budget}")
    print(plan.table())

    def report(when: str) -> int:
        taken, p = _taken(), llm.engine.memory.plan
        diff = taken - context - p.held_bytes
        print(f"{when}: context {context / GIB:.3f} GiB, taken {taken / GIB:.3f} GiB, held by the plan "
              f"{p.held_bytes / GIB:.3f} GiB, taken - context - held = {diff / MIB:+.0f} MiB "
              f"({'within' if abs(diff) <= SLACK else 'OUTSIDE'} 256 MiB); torch reserved "
              f"{torch.cuda.memory_reserved() / GIB:.3f} GiB, allocated {torch.cuda.memory_allocated() / GIB:.3f} GiB; "
              f"planned in all (with activations and reserve) {p.planned_bytes / GIB:.3f} GiB", flush=True)  # fmt: skip
        return 0 if abs(diff) <= SLACK else 1

    rc = report("at start")
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    llm.generate([[5, 6, 7, 8] * 64], params)
    report("after a 256-token prompt and 16 tokens")
    print()
    return rc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="qwen3-30b-a3b,qwen3.6-35b-a3b")
    p.add_argument("--budgets", default="none,20", help="comma list of GiB; none: no --vram-budget")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--backend", default="auto")
    p.add_argument("--one", nargs=2, metavar=("PRESET", "BUDGET"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        return one(a.one[0], a.one[1], a.layers, a.backend)
    rc = 0
    for preset in a.presets.split(","):
        for budget in a.budgets.split(","):
            cmd = [sys.executable, __file__, "--one", preset, budget, "--layers", str(a.layers), "--backend", a.backend]
            rc |= subprocess.run(cmd, check=False).returncode
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
