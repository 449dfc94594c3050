"""Per-layer shapes of the MoE models the benchmarks emulate (routed experts only, bf16).

Synthetic runs keep a preset's per-layer shape exact and may run fewer layers (``--layers``) to fit
the machine; reports say how many ran.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoEShape:
    name: str
    hidden: int  # D
    inter: int  # I, one routed expert's intermediate size
    experts: int  # E per layer
    top_k: int
    layers: int  # MoE layers of the real model
    note: str = ""

    def expert_bytes(self, itemsize: int = 2) -> int:
        return 3 * self.hidden * self.inter * itemsize

    def pool_bytes(self, layers: int, itemsize: int = 2) -> int:
        return layers * self.experts * self.expert_bytes(itemsize)


PRESETS: dict[str, MoEShape] = {
    s.name: s
    for s in (
        MoEShape("qwen3-30b-a3b", 2048, 768, 128, 8, 48),
        MoEShape("qwen3.6-35b-a3b", 2048, 512, 256, 8, 40, "its shared expert is not modelled"),
        MoEShape("gpt-oss-20b", 2880, 2880, 32, 4, 24, "bf16 experts here (the checkpoint ships MXFP4)"),
    )
}


def get_preset(name: str) -> MoEShape:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name]
