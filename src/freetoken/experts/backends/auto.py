"""``moe_backend="auto"``: fused when the pool fits the VRAM budget, else what the machine profile recommends
for this expert size (``hardware.profile.recommend``: hybrid or offload), else offload (also when no profile
exists). Logs why."""

from __future__ import annotations

import logging

import torch

from freetoken.experts.backends.split_policy import saved_profile
from freetoken.experts.base import ExpertBanks
from freetoken.experts.slots.sizing import VRAM_SLOT_SHARE
from freetoken.hardware.profile import HardwareProfile, recommend

log = logging.getLogger(__name__)


def choose_backend(
    banks: ExpertBanks,
    device: torch.device,
    vram_free: int | None = None,
    profile: HardwareProfile | None = None,
    load_profile: bool = True,
) -> tuple[str, str]:
    """(backend name, reason). ``vram_free``/``profile`` default to what this machine reports."""
    if device.type != "cuda":
        return "fused", "the compute device is the CPU: the pool is already in its memory"
    if vram_free is None:
        vram_free = int(torch.cuda.mem_get_info(device)[0])
    budget = int(vram_free * VRAM_SLOT_SHARE)
    if banks.pool_bytes <= budget:
        return "fused", f"the expert pool ({banks.pool_bytes / 2**30:.1f} GiB) fits the VRAM budget"
    if profile is None and load_profile:
        profile = saved_profile()
    if profile is None:
        return "offload", "no machine profile (run `ft bench bw`): copying misses is the safe choice"
    rec = recommend(profile, banks.expert_bytes)
    # "cpu" (PCIe adds little) still runs hybrid: its split sends nearly every miss to the CPU while one
    # fill per layer keeps the cache warming.
    return ("hybrid" if rec.backend == "cpu" else rec.backend), f"machine profile: {rec}"


def resolve_auto(banks: ExpertBanks, device: torch.device) -> str:
    name, why = choose_backend(banks, device)
    log.info("moe backend auto -> %s: %s", name, why)
    return name
