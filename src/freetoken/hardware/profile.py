"""Hardware profiles: measured bandwidths saved per machine fingerprint, and what they recommend.

A profile is JSON under ``env().cache_dir/profiles/<fingerprint>.json``. A profile carried over from
another machine (or a machine whose hardware changed) is detected by its fingerprint.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freetoken.config import env
from freetoken.hardware.bandwidth import BandwidthResult
from freetoken.hardware.probe import MachineInfo, probe

PROFILE_VERSION = 1
# Below this share of the combined miss bandwidth, a branch is not worth its overheads.
_MINOR_SHARE = 0.1


class ProfileMismatchError(ValueError):
    """The profile was measured on another machine (its fingerprint differs from this one's)."""


@dataclass(frozen=True)
class HardwareProfile:
    machine: MachineInfo
    bandwidth: BandwidthResult
    created: float = field(default_factory=time.time)
    fingerprint: str = ""  # of `machine`; filled in by __post_init__ when empty
    # the CPU kernel's thread count `ft bench bw --sweep` chose (the engine's default then); None: not swept
    kernel_threads: int | None = None

    def __post_init__(self) -> None:
        if not self.fingerprint:
            object.__setattr__(self, "fingerprint", self.machine.fingerprint())

    def is_for(self, machine: MachineInfo) -> bool:
        return self.fingerprint == machine.fingerprint()

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PROFILE_VERSION,
            "fingerprint": self.fingerprint,
            "created": self.created,
            "machine": self.machine.to_dict(),
            "bandwidth": self.bandwidth.to_dict(),
            "kernel_threads": self.kernel_threads,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HardwareProfile:
        if d.get("version") != PROFILE_VERSION:
            raise ValueError(f"unsupported profile version {d.get('version')!r}")
        return cls(
            machine=MachineInfo.from_dict(d["machine"]),
            bandwidth=BandwidthResult(**d["bandwidth"]),
            created=float(d["created"]),
            fingerprint=str(d["fingerprint"]),
            kernel_threads=None if d.get("kernel_threads") is None else int(d["kernel_threads"]),
        )


def profiles_dir(cache_dir: str | None = None) -> Path:
    return Path(cache_dir or env().cache_dir) / "profiles"


def save_profile(profile: HardwareProfile, cache_dir: str | None = None) -> Path:
    path = profiles_dir(cache_dir) / f"{profile.fingerprint}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(profile.to_dict(), indent=2))
    os.replace(tmp, path)
    return path


def load_profile(path: str | Path, machine: MachineInfo | None = None) -> HardwareProfile:
    """Read a profile; with `machine`, raise ProfileMismatchError when it was measured elsewhere."""
    profile = HardwareProfile.from_dict(json.loads(Path(path).read_text()))
    if machine is not None and not profile.is_for(machine):
        raise ProfileMismatchError(
            f"profile {path} was measured on machine {profile.fingerprint}, this is {machine.fingerprint()} "
            f"({profile.machine.cpu_model!r} vs {machine.cpu_model!r}); run `ft bench bw` again"
        )
    return profile


def current_profile(
    cache_dir: str | None = None, machine: MachineInfo | None = None
) -> HardwareProfile | None:
    """This machine's saved profile, or None (missing, unreadable or from other hardware: warned)."""
    machine = machine or probe()
    path = profiles_dir(cache_dir) / f"{machine.fingerprint()}.json"
    if not path.exists():
        return None
    try:
        return load_profile(path, machine)
    except (ValueError, KeyError, TypeError, OSError) as exc:
        warnings.warn(f"ignoring hardware profile {path}: {exc}", stacklevel=2)
        return None


def miss_gbps(bw: BandwidthResult) -> float:
    """What a thread count is worth to decode: B_P' + B_H' (the hybrid split's miss bandwidth) where copies were
    measured, else B_H (every miss on the CPU)."""
    if bw.fill_concurrent is not None and bw.cpu_kernel_concurrent is not None:
        return bw.fill_concurrent + bw.cpu_kernel_concurrent
    return bw.cpu_kernel


def pick_threads(results: dict[int, BandwidthResult], tolerance: float = 0.03) -> int:
    """The fewest threads within ``tolerance`` of the best ``miss_gbps``: more threads than that only take cores
    from the engine thread and the driver (and host-memory bandwidth from the copies)."""
    if not results:
        raise ValueError("no thread counts were measured")
    best = max(miss_gbps(bw) for bw in results.values())
    return min(n for n, bw in results.items() if miss_gbps(bw) >= (1 - tolerance) * best)


def profile_kernel_threads() -> int | None:
    """The thread count this machine's saved profile chose (``ft bench bw --sweep``), None without one."""
    try:
        profile = current_profile()
    except (OSError, ValueError, RuntimeError):
        return None
    return None if profile is None else profile.kernel_threads


def _fill_gbps(bw: BandwidthResult, expert_bytes: int) -> float | None:
    """B_P' for experts of `expert_bytes`: the per-copy overhead seen in the fill figure (vs the
    whole-layer copy) scaled to this size, applied to the concurrent fill bandwidth."""
    if bw.fill is None or bw.layer is None or bw.fill_concurrent is None:
        return None
    per_copy = max(0.0, bw.expert_bytes / (bw.fill * 1e9) - bw.expert_bytes / (bw.layer * 1e9))  # seconds
    seconds = expert_bytes / (bw.fill_concurrent * 1e9) + per_copy
    return expert_bytes / seconds / 1e9


@dataclass(frozen=True)
class Recommendation:
    """Which MoE backend suits an expert size on this machine: ``backend`` is "offload", "hybrid" or "cpu"."""

    backend: str
    reason: str
    fill_share: float  # of a layer's misses to fill over PCIe (the rest run on the CPU)

    def __str__(self) -> str:
        return f"{self.backend}: {self.reason}"


def recommend(profile: HardwareProfile, expert_bytes: int) -> Recommendation:
    """Which MoE backend suits experts of `expert_bytes` on this machine, and why."""
    bw = profile.bandwidth
    mb = expert_bytes / 1e6
    if not profile.machine.gpus or bw.fill is None:
        why = f"no GPU; misses run on the CPU at {bw.cpu_kernel:.1f} GB/s ({mb / bw.cpu_kernel:.2f} ms/expert)"
        return Recommendation("cpu", why, 0.0)
    b_p = _fill_gbps(bw, expert_bytes) or 0.0
    b_h = bw.cpu_kernel_concurrent if bw.cpu_kernel_concurrent is not None else bw.cpu_kernel
    both = b_p + b_h
    if b_h < _MINOR_SHARE * both:
        why = (f"the CPU adds only {b_h:.1f} GB/s to {b_p:.1f} GB/s of PCIe fills ({b_h / both:.0%}); fill every "
               f"miss ({mb / b_p:.2f} ms/expert)")  # fmt: skip
        return Recommendation("offload", why, 1.0)
    if b_p < _MINOR_SHARE * both:
        return Recommendation("cpu", f"PCIe fills ({b_p:.1f} GB/s) add little to the CPU kernel ({b_h:.1f} GB/s)",
                              b_p / both)  # fmt: skip
    why = (f"fill {b_p / both:.0%} of misses over PCIe ({b_p:.1f} GB/s) and run the rest on the CPU ({b_h:.1f} "
           f"GB/s): misses at {both:.1f} GB/s vs {b_p:.1f} fill-only ({mb / both:.2f} ms/expert)")  # fmt: skip
    return Recommendation("hybrid", why, b_p / both)
