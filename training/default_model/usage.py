"""Expert usage balance: the share of routed (token, slot) pairs each expert gets, per layer."""

from __future__ import annotations

import torch
from transformers import Qwen3MoeForCausalLM


@torch.no_grad()
def expert_usage(model: Qwen3MoeForCausalLM, batches: list[dict[str, torch.Tensor]], device: str) -> torch.Tensor:
    """[layers, E] fraction of top-k assignments per expert over the real (unpadded) tokens."""
    cfg = model.config
    counts = torch.zeros(cfg.num_hidden_layers, cfg.num_experts, dtype=torch.float64)
    for b in batches:
        ids, att = b["input_ids"].to(device), b["attention_mask"].to(device)
        out = model(input_ids=ids, attention_mask=att, output_router_logits=True)
        keep = att.reshape(-1).bool()
        for layer, logits in enumerate(out.router_logits):  # each [B*T, E]
            top = logits[keep].topk(cfg.num_experts_per_tok, dim=-1).indices.reshape(-1)
            counts[layer] += torch.bincount(top, minlength=cfg.num_experts).double().cpu()
    return counts / counts.sum(dim=1, keepdim=True)


def format_usage(frac: torch.Tensor) -> str:
    """One line per layer: min/max share vs the uniform 1/E, and normalised entropy (1 = balanced)."""
    e = frac.shape[1]
    lines = ["[usage] per layer: min share, max share (uniform = %.4f), normalised entropy" % (1 / e)]
    for layer, f in enumerate(frac):
        ent = float(-(f.clamp_min(1e-12) * f.clamp_min(1e-12).log()).sum() / torch.log(torch.tensor(float(e))))
        lines.append(f"[usage] layer {layer}: min {f.min():.4f} max {f.max():.4f} entropy {ent:.3f}")
    return "\n".join(lines)
