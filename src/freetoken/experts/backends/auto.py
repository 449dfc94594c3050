"""``moe_backend="auto"``: fused when the memory plan holds the whole pool on the device (without a VRAM budget: a
budget asks for slots it can resize), else what the machine profile recommends for this expert size
(``hardware.profile.recommend``: hybrid or offload), else offload (also when no profile exists). Logs why."""

from __future__ import annotations

import logging

import torch

from freetoken.experts.backends.split_policy import saved_profile
from freetoken.experts.base import ExpertBanks
from freetoken.hardware.profile import HardwareProfile, recommend

log = logging.getLogger(__name__)


def choose_backend(
    banks: ExpertBanks,
    device: torch.device,
    pool_fits: bool = False,
    profile: HardwareProfile | None = None,
    load_profile: bool = True,
) -> tuple[str, str]:
    """(backend name, reason). ``pool_fits``: the memory plan gives every expert a slot (``loader/memory_plan.py``);
    ``profile`` defaults to this machine's saved one."""
    if device.type != "cuda":
        return "fused", "the compute device is the CPU: the pool is already in its memory"
    if pool_fits:
        return "fused", f"the expert pool ({banks.pool_bytes / 2**30:.1f} GiB) fits the memory plan"
    if profile is None and load_profile:
        profile = saved_profile()
    if profile is None:
        return "offload", "no machine profile (run `ft bench bw`): copying misses is the safe choice"
    rec = recommend(profile, banks.expert_bytes)
    # "cpu" (PCIe adds little) still runs hybrid: its split sends nearly every miss to the CPU while one
    # fill per layer keeps the cache warming.
    return ("hybrid" if rec.backend == "cpu" else rec.backend), f"machine profile: {rec}"


def resolve_auto(banks: ExpertBanks, device: torch.device, pool_fits: bool = False) -> str:
    name, why = choose_backend(banks, device, pool_fits)
    log.info("moe backend auto -> %s: %s", name, why)
    return name
