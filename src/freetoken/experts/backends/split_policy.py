"""The q split: which share of a layer's misses to copy into slots (the rest run on the CPU).

``share = B_P' / (B_P' + B_H')`` (DESIGN §2), with the copy and CPU-kernel bandwidths measured while
both run at once. Sources, strongest first: ``fill_fraction`` (fixed, for tests and experiments); else
a machine profile (``ft bench bw``; a dict, see ``PROFILE_KEYS``) refined online from measured branch
bandwidths (exponential smoothing); no profile: ``DEFAULT_SHARE``, refined online the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from freetoken.hardware.profile import HardwareProfile, current_profile

# Profile keys, GB/s, first present wins: the contended figures, then the solo ones. The first names
# are those of ``freetoken.hardware.bandwidth.BandwidthResult``; the b_* aliases serve plain dicts.
PROFILE_KEYS = {
    "copy": ("fill_concurrent", "b_p_concurrent", "fill", "b_p"),
    "cpu": ("cpu_kernel_concurrent", "b_h_concurrent", "cpu_kernel", "b_h"),
}
# Without a profile: the copy link and the CPU kernel are assumed equally fast until measured.
DEFAULT_SHARE = 0.5


def profile_bandwidth(profile: Mapping[str, object], kind: str) -> float | None:
    """The first present bandwidth of ``kind`` ("copy" or "cpu") in GB/s; None when absent."""
    for key in PROFILE_KEYS[kind]:
        v = profile.get(key)
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
    return None


def share_from_bandwidths(b_copy: float, b_cpu: float) -> float:
    return b_copy / (b_copy + b_cpu)


@dataclass
class SplitPolicy:
    """Holds the current share; the backend writes it into its device scalar between steps."""

    share: float
    fixed: bool  # fill_fraction given: never refined
    b_copy: float | None = None  # smoothed GB/s
    b_cpu: float | None = None
    smoothing: float = 0.2  # weight of a new measurement

    @classmethod
    def create(cls, fill_fraction: float | None, profile: Mapping[str, object] | None = None) -> SplitPolicy:
        if fill_fraction is not None:
            return cls(share=float(fill_fraction), fixed=True)
        if profile:
            b_copy, b_cpu = profile_bandwidth(profile, "copy"), profile_bandwidth(profile, "cpu")
            if b_copy is not None and b_cpu is not None:
                return cls(share_from_bandwidths(b_copy, b_cpu), False, b_copy, b_cpu)
        return cls(share=DEFAULT_SHARE, fixed=False)

    def _smooth(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def observe(self, copy_bytes: int, copy_s: float, cpu_bytes: int, cpu_s: float) -> float:
        """Fold in one step's measured branch bandwidths (bytes, seconds); returns the new share."""
        if self.fixed:
            return self.share
        if copy_bytes > 0 and copy_s > 0:
            self.b_copy = self._smooth(self.b_copy, copy_bytes / copy_s / 1e9)
        if cpu_bytes > 0 and cpu_s > 0:
            self.b_cpu = self._smooth(self.b_cpu, cpu_bytes / cpu_s / 1e9)
        if self.b_copy is not None and self.b_cpu is not None:
            self.share = share_from_bandwidths(self.b_copy, self.b_cpu)
        return self.share


def saved_profile() -> HardwareProfile | None:
    """This machine's saved ``HardwareProfile`` (``ft bench bw``), None when absent or unreadable."""
    try:
        return current_profile()
    except (OSError, ValueError, RuntimeError):
        return None


def load_machine_profile() -> dict[str, object] | None:
    """This machine's bandwidth figures from its saved profile, None when absent."""
    prof = saved_profile()
    return None if prof is None else dict(prof.bandwidth.to_dict())
