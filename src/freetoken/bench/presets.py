"""Per-layer shapes of the MoE models the benchmarks emulate (routed experts only; bf16, or the checkpoint's
quantised format for the ``-fp8`` presets: the same shape in fp8 e4m3 with 128x128 block scales).

Synthetic runs keep a preset's per-layer shape exact and may run fewer layers (``--layers``) to fit
the machine; reports say how many ran.
"""

from __future__ import annotations

from dataclasses import dataclass

from freetoken.quant import WeightFormat, format_by_name


@dataclass(frozen=True)
class MoEShape:
    name: str
    hidden: int  # D
    inter: int  # I, one routed expert's intermediate size
    experts: int  # E per layer
    top_k: int
    layers: int  # MoE layers of the real model
    note: str = ""
    weights: str = "bf16"  # the routed experts' format (``quant.format_by_name``)

    @property
    def fmt(self) -> WeightFormat:
        return format_by_name(self.weights)

    def expert_bytes(self, itemsize: int = 2) -> int:
        """One expert as banked: packed bytes and scales (``itemsize``: the unquantised dtype's)."""
        f, D, I = self.fmt, self.hidden, self.inter
        return f.row_bytes(2 * I, D, itemsize) + f.row_bytes(D, I, itemsize)

    def pool_bytes(self, layers: int, itemsize: int = 2) -> int:
        return layers * self.experts * self.expert_bytes(itemsize)


PRESETS: dict[str, MoEShape] = {
    s.name: s
    for s in (
        MoEShape("qwen3-30b-a3b", 2048, 768, 128, 8, 48),
        MoEShape("qwen3-30b-a3b-fp8", 2048, 768, 128, 8, 48, "Qwen3-30B-A3B-FP8's experts", "fp8_block"),
        MoEShape("qwen3.6-35b-a3b", 2048, 512, 256, 8, 40, "its shared expert is not modelled"),
        MoEShape("qwen3.6-35b-a3b-fp8", 2048, 512, 256, 8, 40, "the FP8 release's experts; shared expert not modelled",
                 "fp8_block"),
        MoEShape("gpt-oss-20b", 2880, 2880, 32, 4, 24, "bf16 experts here (the checkpoint ships MXFP4)"),
    )
}


def get_preset(name: str) -> MoEShape:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
    return PRESETS[name]
