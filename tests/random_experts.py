"""Random expert banks and routing for the expert backends' tests (``D``, ``I``, ``K_TOP``), and random steps through
a backend against ``moe_reference``. Importing it registers the peers' placements (static-layers, static-freq), so
``SLOT_BACKENDS`` can all be created."""

from __future__ import annotations

import torch

from freetoken.bench.placements import register
from freetoken.experts.base import ExpertBackend, ExpertBanks
from freetoken.experts.reference import moe_reference
from freetoken.experts.slots.plan import RouteGroups, group_routes

D, I, K_TOP = 64, 32, 2
SLOT_BACKENDS = ["offload", "cpu", "hybrid", "static-layers", "static-freq"]
HAS_CUDA = torch.cuda.is_available()

register()  # the static-layers and static-freq backends


def make_banks(L: int, E: int, seed: int, device: str = "cpu") -> ExpertBanks:
    g = torch.Generator().manual_seed(seed)
    gu = torch.randn(L * E, 2 * I, D, generator=g) / D**0.5
    dn = torch.randn(L * E, D, I, generator=g) / I**0.5
    return ExpertBanks(gu.to(device), dn.to(device), L, E)


def assert_did_work(name: str, s: dict) -> None:
    """Fills for the backends that copy, CPU runs for those that compute on the host."""
    if name in ("offload", "hybrid"):
        assert s["expert_fills"] > 0
    if name in ("cpu", "hybrid"):
        assert s["expert_cpu_runs"] > 0


def random_routing(T: int, E: int, g: torch.Generator, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.rand(T, E, generator=g).argsort(dim=1)[:, :K_TOP]
    w = torch.softmax(torch.randn(T, K_TOP, generator=g), dim=-1)
    return ids.to(device), w.to(device)


def run_steps(
    backend: ExpertBackend, banks: ExpertBanks, steps: int, seed: int, device: torch.device, max_t: int = 40
) -> float:
    """Random steps through every layer; returns the worst relative error against the reference."""
    g = torch.Generator().manual_seed(seed)
    L, E = banks.num_layers, banks.num_experts
    gu, dn = banks.gate_up.to(device), banks.down.to(device)
    worst = 0.0
    for _ in range(steps):
        T = int(torch.randint(1, max_t + 1, (1,), generator=g))
        backend.begin_step(T, True)
        for layer in range(L):
            x = torch.randn(T, D, generator=g).to(device)
            ids, w = random_routing(T, E, g, device)
            ref = moe_reference(x, ids + layer * E, w, gu, dn)
            out = backend.forward(layer, x, ids, w)
            assert out.shape == ref.shape and out.dtype == ref.dtype
            worst = max(worst, float((out - ref).abs().max() / ref.abs().max()))
        backend.check_integrity()
    return worst


def thirds_elsewhere(
    ids: torch.Tensor, w: torch.Tensor, banks: ExpertBanks
) -> tuple[RouteGroups, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Slot banks = the pool plus the scratch slot, every third group served elsewhere (slot -1): the groups, each
    group's slot, the slot banks and the routes' weights with the elsewhere routes' zeroed (what the slots sum)."""
    T, E = ids.shape[0], banks.num_experts
    groups = group_routes(ids.reshape(-1), E)
    slot = torch.where(torch.arange(T * K_TOP) % 3 == 2, -1, groups.eid.clamp(max=E - 1))
    slot = torch.where(groups.valid, slot, -1)
    gu = torch.cat([banks.gate_up, torch.zeros_like(banks.gate_up[:1])])  # + scratch slot
    dn = torch.cat([banks.down, torch.zeros_like(banks.down[:1])])
    on = slot[groups.route_group] >= 0
    return groups, slot, gu, dn, torch.where(on.view(T, K_TOP), w, torch.zeros_like(w))
