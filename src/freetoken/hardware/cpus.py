"""CPU topology: which logical CPUs are distinct physical cores (for pinning kernel workers)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

_SYS_CPU = Path("/sys/devices/system/cpu")


def _allowed_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def physical_core_cpus() -> list[int]:
    """One logical CPU id per physical core this process may run on (the lowest id of each core).

    SMT siblings share a core's load ports and caches, so bandwidth-bound workers go one per core.
    Without sysfs topology (non-Linux, containers hiding it) every allowed CPU counts as a core.
    """
    seen: dict[tuple[int, int], int] = {}
    for cpu in _allowed_cpus():
        topo = _SYS_CPU / f"cpu{cpu}" / "topology"
        core = _read_int(topo / "core_id")
        pkg = _read_int(topo / "physical_package_id")
        key = (pkg if pkg is not None else 0, core if core is not None else cpu)
        seen.setdefault(key, cpu)
    return sorted(seen.values())


def physical_cores() -> int:
    return max(1, len(physical_core_cpus()))


def default_kernel_threads() -> int:
    """Workers for the CPU expert kernel: physical cores - 1 (one core left to the engine thread), min 1."""
    return max(1, physical_cores() - 1)


def worker_cpus(n: int) -> list[int]:
    """CPUs to pin n kernel workers to, one per physical core: the first core is left to the engine
    thread (and interrupts) while a core is spare; lower ids first (the performance cores on hybrid
    Intel parts)."""
    cores = physical_core_cpus()
    return cores[1 : n + 1] if n < len(cores) else cores[:n]


@functools.lru_cache(maxsize=1)
def cpu_vendor() -> str:
    """The x86 vendor string ("GenuineIntel", "AuthenticAMD", ...) from /proc/cpuinfo; "" when unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""
