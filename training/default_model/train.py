"""Train FreeToken's embedded default model (tiny Qwen3-MoE) from scratch on synthetic data.

    python -m training.default_model.train --out src/freetoken/assets/default_model

Generates the data (seeded), trains the BPE tokenizer, trains with plain torch AdamW plus the
router load-balancing loss, saves a midway checkpoint, then the final one, and prints the final
loss and the expert usage balance. Needs transformers (training only; the engine never does).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import Qwen3MoeForCausalLM

from training.default_model.checkpoint_io import save_checkpoint
from training.default_model.data import batches, generate_pieces, tokenize
from training.default_model.model_config import build_config, param_count
from training.default_model.tokenizer_train import train_tokenizer
from training.default_model.usage import expert_usage, format_usage

SAVE_RESERVE_S = 15.0  # time kept back from --time-budget for the checkpoints and the usage report


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="final checkpoint directory")
    p.add_argument("--mid-out", type=Path, default=None, help="midway checkpoint directory (default: OUT-mid)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--conversations", type=int, default=300_000, help="training conversations generated")
    p.add_argument("--tokenizer-conversations", type=int, default=40_000)
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--max-len", type=int, default=640)
    p.add_argument("--steps", type=int, default=3000, help="optimizer steps (upper bound with --time-budget)")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds for the whole run (data + training); >0 caps --steps from the measured speed")
    p.add_argument("--batch-size", type=int, default=320)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--toy", action="store_true", help="tiny model, for a CPU smoke run")
    return p.parse_args()


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def token_id(tok: Tokenizer, token: str) -> int:
    i = tok.token_to_id(token)
    if i is None:
        raise ValueError(f"tokenizer lacks {token}")
    return i


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def pick_experts_implementation(model: Qwen3MoeForCausalLM, batch: dict[str, torch.Tensor], device: str) -> None:
    """Time a few forward/backward passes per transformers experts implementation; keep the fastest
    that works (grouped_mm needs a recent transformers; eager always works)."""
    batch = {k: v.to(device) for k, v in batch.items()}
    best: tuple[float, str] = (float("inf"), "eager")
    for impl in ("grouped_mm", "eager"):
        try:
            model.set_experts_implementation(impl)
            for i in range(4):
                if i == 1:
                    _sync(device)
                    t = time.time()
                with torch.autocast(device.split(":")[0], dtype=torch.bfloat16):
                    out = model(**batch, output_router_logits=True)
                out.loss.backward()
            _sync(device)
            best = min(best, ((time.time() - t) / 3, impl))
            print(f"[model] experts implementation {impl}: {(time.time() - t) / 3 * 1000:.0f} ms/step", flush=True)
        except Exception as exc:  # an implementation this transformers lacks
            print(f"[model] experts implementation {impl} failed: {type(exc).__name__}: {exc}", flush=True)
    model.zero_grad(set_to_none=True)
    model.set_experts_implementation(best[1])
    print(f"[model] using {best[1]}", flush=True)


def train(args: argparse.Namespace) -> None:
    t0 = time.time()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    convs = generate_pieces(args.conversations, args.seed, args.workers)
    print(f"[data] {len(convs)} conversations rendered in {time.time() - t0:.1f}s", flush=True)
    tok = train_tokenizer(("".join(t for t, _ in c) for c in convs[:args.tokenizer_conversations]),
                          args.vocab_size)
    samples = tokenize(tok, convs, args.max_len)
    del convs
    n_tok = sum(len(x) for x, _ in samples)
    print(f"[data] tokenizer vocab {tok.get_vocab_size()}; {len(samples)} samples, {n_tok} tokens; "
          f"{time.time() - t0:.1f}s", flush=True)
    pad, im_end = token_id(tok, "<|endoftext|>"), token_id(tok, "<|im_end|>")
    cfg = build_config(tok.get_vocab_size(), [im_end, pad], pad, toy=args.toy)
    model = Qwen3MoeForCausalLM(cfg).to(args.device)
    if args.device.startswith("cuda") or args.toy:
        pick_experts_implementation(model, next(batches(samples, args.batch_size, pad, args.seed + 1)), args.device)
    print(f"[model] {param_count(cfg)} parameters ({param_count(cfg) * 2 / 1e6:.1f} MB in bf16)", flush=True)
    run_loop(args, model, samples, pad, tok, t0)


def planned_steps(args: argparse.Namespace, step: int, per_step: float, elapsed: float) -> int:
    """Steps that fit the time budget at the measured speed (never fewer than already run)."""
    left = args.time_budget - elapsed - SAVE_RESERVE_S
    return max(args.warmup + 10, step + 1, min(args.steps, step + 1 + int(left / per_step)))


def train_step(model: Any, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor], lr: float,
               amp: Any) -> tuple[Any, torch.Tensor]:
    """One optimizer step at learning rate ``lr`` (bf16 autocast when ``amp``, router aux loss in the loss, gradients
    clipped at 1.0); the model's output and the step's cross-entropy without the aux loss (not synced)."""
    for g in opt.param_groups:
        g["lr"] = lr
    with amp if amp is not None else torch.enable_grad():
        out = model(**batch, output_router_logits=True)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out, (out.loss - model.config.router_aux_loss_coef * out.aux_loss).detach()


def run_loop(args: argparse.Namespace, model: Qwen3MoeForCausalLM, samples: list, pad: int, tok: Tokenizer,
             t0: float) -> None:
    opt = make_optimizer(model, args.lr)
    total, mid_saved = args.steps, False
    # The speed is measured over the second half of the warm-up (the first steps pay for kernel
    # selection on new shapes); the warm-up's learning rate does not depend on `total`.
    probe_from, t_probe = args.warmup // 2, 0.0
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if args.device.startswith("cuda") else None
    it = batches(samples, args.batch_size, pad, args.seed)
    recent: list[torch.Tensor] = []  # CE of the last steps, read once at the end (no per-step sync)
    model.train()
    step = 0
    while step < total:
        batch = {k: v.to(args.device, non_blocking=True) for k, v in next(it).items()}
        out, ce_t = train_step(model, opt, batch, lr_at(step, total, args.lr, args.warmup), amp)
        recent = (recent + [ce_t])[-20:]
        if step == probe_from:
            _sync(args.device)
            t_probe = time.time()
        if step == args.warmup - 1 and args.time_budget > 0:
            _sync(args.device)
            per_step = (time.time() - t_probe) / (step - probe_from)
            total = planned_steps(args, step, per_step, time.time() - t0)
            print(f"[train] {per_step * 1000:.0f} ms/step -> {total} steps", flush=True)
        if step % 50 == 0 or step == total - 1:
            print(f"[train] step {step} ce {ce_t.item():.4f} aux {out.aux_loss.item():.4f} "
                  f"lr {opt.param_groups[0]['lr']:.2e} {time.time() - t0:.0f}s", flush=True)
        if not mid_saved and step >= total // 2:
            save_checkpoint(model, tok, args.mid_out or args.out.with_name(args.out.name + "-mid"))
            mid_saved = True
        step += 1
    model.eval()
    save_checkpoint(model, tok, args.out)
    final = torch.stack(recent).mean().item()
    usage = expert_usage(model, [next(it) for _ in range(4)], args.device)
    print(format_usage(usage), flush=True)
    print(f"[done] final loss (assistant-token CE, mean of the last {len(recent)} steps) {final:.4f}; "
          f"steps {total}; total time {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    train(parse_args())
