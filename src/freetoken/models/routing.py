"""A family's router switches read from ``config.json`` and checked: DeepSeek-V3-style sigmoid routing (GLM-4.5 to
4.7, MiniMax-M2, DeepSeek-V3) with group limits, renormalisation and a routed scaling factor
(``kernels/route.SigmoidRouting``). A setting the kernels would read wrong is refused here, naming the field."""

from __future__ import annotations

from typing import Any

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.hf_config import HFConfig
from freetoken.kernels.route import SigmoidRouting
from freetoken.models.base import Family


def sigmoid_routing(hf: HFConfig, family: Family) -> SigmoidRouting | None:
    """The family's sigmoid routing as ``config.json`` sets it; None for softmax families."""
    if family.routing == "softmax":
        return None
    if family.routing != "sigmoid":
        raise ValueError(f"{family.architectures[0]}: unknown routing {family.routing!r}")
    raw, where, E, k = hf.raw, hf.path / "config.json", hf.num_experts, hf.top_k
    scoring = raw.get("scoring_func", "sigmoid")
    if scoring != "sigmoid":
        raise CheckpointError(f"{where}: scoring_func {scoring!r} is not implemented for {hf.architecture} "
                              f"(supported: sigmoid)")  # fmt: skip
    if not family.routing_groups:  # the family's reference reads none of the group fields
        return SigmoidRouting(top_k=k, norm_topk=hf.norm_topk_prob or family.always_norm_topk)
    n_group, topk_group = _int(raw, "n_group", 1, where), _int(raw, "topk_group", 1, where)
    if n_group < 1 or E % n_group:
        raise CheckpointError(f"{where}: n_routed_experts ({E}) is not divisible by n_group ({n_group})")
    if not 1 <= topk_group <= n_group:
        raise CheckpointError(f"{where}: topk_group ({topk_group}) must be in [1, n_group = {n_group}]")
    if n_group > 1 and E // n_group < 2:
        raise CheckpointError(f"{where}: n_group ({n_group}) leaves fewer than 2 experts a group (group scores "
                              f"sum each group's top 2)")  # fmt: skip
    if not 1 <= k <= topk_group * (E // n_group):
        most = topk_group * (E // n_group)
        raise CheckpointError(f"{where}: num_experts_per_tok ({k}) must be in [1, {most}] (topk_group "
                              f"{topk_group} of n_group {n_group} groups of {E // n_group} experts)")  # fmt: skip
    try:
        value = raw.get("routed_scaling_factor")
        scale = 1.0 if value is None else float(value)
    except (TypeError, ValueError):
        raise CheckpointError(f"{where}: routed_scaling_factor must be a number") from None
    if not scale > 0:
        raise CheckpointError(f"{where}: routed_scaling_factor ({scale}) must be positive")
    norm = hf.norm_topk_prob or family.always_norm_topk
    return SigmoidRouting(top_k=k, norm_topk=norm, n_group=n_group, topk_group=topk_group, scale=scale)


def _int(raw: dict[str, Any], key: str, default: int, where: object) -> int:
    value = raw.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{where}: {key} must be an integer, got {value!r}")
    return value
