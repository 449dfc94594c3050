"""What this machine is: CPU model, ISA flags, cores, RAM, NUMA nodes, GPUs; and a fingerprint.

The fingerprint names the parts that decide bandwidth (CPU model, physical cores, RAM size, NUMA
nodes, GPU models and VRAM sizes), not the momentary ones (free RAM, free VRAM), so a profile
measured once stays valid until the hardware changes.
"""

from __future__ import annotations

import hashlib
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from freetoken.hardware.cpus import physical_cores

# ISA features that matter to the CPU expert kernel or to future quantised paths.
ISA_FLAGS = (
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve",
)  # fmt: skip
_GIB = 2**30


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    vram_total: int  # bytes


@dataclass(frozen=True)
class MachineInfo:
    cpu_model: str
    isa_flags: tuple[str, ...]
    physical_cores: int
    logical_cpus: int
    ram_total: int  # bytes
    ram_available: int  # bytes, at probe time
    numa_nodes: int
    gpus: tuple[GpuInfo, ...] = field(default_factory=tuple)

    def fingerprint(self) -> str:
        """Stable id of the hardware (changes when the CPU, RAM size, NUMA layout or GPUs change)."""
        gpus = ",".join(f"{g.name}/{round(g.vram_total / _GIB)}G" for g in self.gpus) or "nogpu"
        key = (
            f"{self.cpu_model}|{self.physical_cores}c|{round(self.ram_total / _GIB)}G|"
            f"numa{self.numa_nodes}|{gpus}|{platform.machine()}"
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MachineInfo:
        gpus = tuple(GpuInfo(g["index"], g["name"], g["vram_total"]) for g in d.get("gpus", ()))
        return cls(**{**d, "isa_flags": tuple(d["isa_flags"]), "gpus": gpus})


def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = "", set[str]()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model or platform.processor() or platform.machine(), flags


def _meminfo() -> tuple[int, int]:
    vals: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                vals[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    if "MemTotal" not in vals and hasattr(os, "sysconf"):
        try:
            vals["MemTotal"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            vals["MemTotal"] = 0
    return vals.get("MemTotal", 0), vals.get("MemAvailable", vals.get("MemTotal", 0))


def _numa_nodes() -> int:
    nodes = list(Path("/sys/devices/system/node").glob("node[0-9]*"))
    return max(1, len(nodes))


def probe_gpus() -> tuple[GpuInfo, ...]:
    """CUDA devices via torch (empty without CUDA): their properties only, so no CUDA context is made (a context
    costs a CPU-device engine ~100 MB of host memory and a GPU's memory)."""
    try:
        import torch
    except ImportError:
        return ()
    if not torch.cuda.is_available():
        return ()
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append(GpuInfo(i, props.name, int(props.total_memory)))
    return tuple(gpus)


def probe(gpus: bool = True) -> MachineInfo:
    model, flags = _cpuinfo()
    total, available = _meminfo()
    return MachineInfo(
        cpu_model=model,
        isa_flags=tuple(f for f in ISA_FLAGS if f in flags),
        physical_cores=physical_cores(),
        logical_cpus=os.cpu_count() or 1,
        ram_total=total,
        ram_available=available,
        numa_nodes=_numa_nodes(),
        gpus=probe_gpus() if gpus else (),
    )
