"""Train the embedded default model v2 (tiny Qwen3.5-MoE hybrid, 64k context) from scratch on synthetic data.

    python -m training.default_model_v2.train --out /tmp/v2 --time-budget 330
    python -m training.default_model_v2.train --out /tmp/v2 --time-budget 400 --schedule-seconds 4000   # run 1 of ~10
    python -m training.default_model_v2.train --out /tmp/v2b --time-budget 400 --resume /tmp/v2           # run 2, ...

Generates v1's short tasks plus agent-shaped conversations (long tool-laden system prompts, histories, the
request last), tokenises them with v1's tokenizer, trains with plain torch AdamW plus the router load-balancing
loss in token-budget batches, and saves the checkpoint (HF layout, bf16). With --time-budget the learning-rate
schedule runs on the clock: training stops when the budget is spent, whatever the speed of the step.

Training spread over runs (a GPU-box call is 10 minutes): ``--schedule-seconds`` makes the schedule that many training
seconds long across runs, and every run writes ``schedule.json`` beside its checkpoint (the seconds trained so far,
runs, steps, tokens, a line per run). ``--resume DIR`` continues DIR's weights at its schedule position: the
optimizer's moments start afresh, so each resumed run warms up again over ``REWARM_STEPS`` steps to the schedule's
learning rate; its data comes from the next seed (``--seed`` + runs so far), so no run repeats another's samples.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import Qwen3_5MoeForCausalLM

from training.default_model import train as v1_train
from training.default_model.checkpoint_io import save_checkpoint
from training.default_model.usage import format_usage
from training.default_model_v2 import fla_gradcheck
from training.default_model_v2.agent_data import batches, describe, generate_samples
from training.default_model_v2.hybrid_config import MAX_POSITIONS, build_config
from training.default_model_v2.v1 import V1_TOKENIZER

SAVE_RESERVE_S = 12.0
SCHEDULE = "schedule.json"  # beside a checkpoint: where its training stands (``Schedule``)
REWARM_STEPS = 20  # a resumed run's warm-up (fresh AdamW moments) back to the schedule's learning rate


@dataclass
class Schedule:
    """Where a training spread over runs stands: the cosine is ``total_s`` training seconds long, ``done_s`` of them
    spent by the runs before."""

    total_s: float
    done_s: float = 0.0
    runs: int = 0
    steps: int = 0
    tokens: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, d: Path) -> Schedule:
        path = d / SCHEDULE
        if not path.is_file():
            raise SystemExit(f"--resume {d}: no {SCHEDULE} (a checkpoint of a run with --schedule-seconds)")
        return cls(**json.loads(path.read_text()))

    def save(self, d: Path) -> None:
        (d / SCHEDULE).write_text(json.dumps(asdict(self), indent=1) + "\n")

    def progress(self, run_s: float) -> float:
        """The schedule's position after ``run_s`` seconds of this run."""
        return (self.done_s + run_s) / self.total_s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="final checkpoint directory")
    p.add_argument("--mid-out", type=Path, default=None, help="midway checkpoint directory (none by default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--short", type=int, default=150_000, help="v1 short conversations")
    p.add_argument("--medium", type=int, default=5_000, help="agent conversations of 1-7k asked prompt tokens")
    p.add_argument("--long", type=int, default=2_000, help="agent conversations of 7-36k asked prompt tokens")
    p.add_argument("--xl", type=int, default=250, help="agent conversations of 40-62k asked prompt tokens")
    p.add_argument("--tokenizer", type=Path, default=V1_TOKENIZER, help="v1's tokenizer.json")
    p.add_argument("--max-len", type=int, default=MAX_POSITIONS)
    p.add_argument("--batch-tokens", type=int, default=65_536, help="padded tokens per step (>= --max-len)")
    p.add_argument("--steps", type=int, default=100_000, help="optimizer steps (upper bound with --time-budget)")
    p.add_argument("--time-budget", type=float, default=0.0,
                   help="seconds for the whole run (data + training); >0 runs the schedule on the clock")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--toy", action="store_true", help="tiny model and data, for a CPU smoke run")
    p.add_argument("--init", type=Path, default=None,
                   help="continue from this v2 checkpoint's weights (pass another --seed for other data)")
    p.add_argument("--schedule-seconds", type=float, default=0.0,
                   help="the learning-rate schedule's length in training seconds across runs (0: this run's budget)")
    p.add_argument("--resume", type=Path, default=None,
                   help="continue this checkpoint's weights at its schedule position (its schedule.json)")
    a = p.parse_args(argv)
    if a.resume is not None and a.init is not None:
        p.error("--resume continues a checkpoint's weights and schedule; --init only weights: one of them")
    if (a.resume is not None or a.schedule_seconds > 0) and a.time_budget <= 0:
        p.error("a schedule across runs runs on the clock: give --time-budget")
    if a.toy:  # a CPU run of a couple of minutes: short prompts, small batches
        a.short, a.medium, a.long, a.xl = min(a.short, 600), min(a.medium, 30), 0, 0
        a.batch_tokens, a.max_len, a.steps = min(a.batch_tokens, 4096), min(a.max_len, 4096), min(a.steps, 12)
    return a


def lr_at(progress: float, step: int, peak: float, warmup: int) -> float:
    """Cosine decay from the peak to 10% of it at progress 1; the run's first `warmup` steps ramp linearly up to it
    (a resumed run warms up to where the schedule stands)."""
    frac = min(1.0, max(0.0, progress))
    lr = peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
    return lr * (step + 1) / warmup if step < warmup else lr


def set_experts_impl(model: Any, batch: dict[str, torch.Tensor], device: str) -> None:
    try:
        v1_train.pick_experts_implementation(model, batch, device)
    except Exception as exc:  # a transformers without set_experts_implementation: its default
        print(f"[model] keeping the default experts implementation ({type(exc).__name__}: {exc})", flush=True)


def from_checkpoint(path: Path, cfg: Any) -> Any:
    """A v2 checkpoint to train on from (a call of the GPU box is 10 minutes: one run continues another's weights;
    the optimizer's moments start afresh, as after a warm restart). Its architecture must be this config's."""
    model = Qwen3_5MoeForCausalLM.from_pretrained(path, dtype=torch.float32)
    keys = ("hidden_size", "num_hidden_layers", "layer_types", "linear_key_head_dim", "linear_value_head_dim",
            "num_experts", "moe_intermediate_size", "vocab_size")
    diff = {k: (getattr(model.config, k), getattr(cfg, k)) for k in keys if getattr(model.config, k) != getattr(cfg, k)}
    if diff:
        raise SystemExit(f"--init {path}: not v2's architecture (checkpoint vs config): {diff}")
    print(f"[model] continuing from {path}", flush=True)
    return model


def schedule_of(args: argparse.Namespace) -> Schedule | None:
    """This run's place in a schedule across runs (None: a run of its own)."""
    if args.resume is not None:
        return Schedule.load(args.resume)
    return Schedule(args.schedule_seconds) if args.schedule_seconds > 0 else None


def train(args: argparse.Namespace) -> None:
    t0 = time.time()
    sched = schedule_of(args)
    if sched is not None and sched.done_s >= sched.total_s:
        raise SystemExit(f"the schedule is complete ({sched.done_s:.0f} of {sched.total_s:.0f} s trained)")
    seed = args.seed + (sched.runs if sched is not None else 0)  # every run of a schedule on other samples
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tok = Tokenizer.from_file(str(args.tokenizer))
    counts = {"short": args.short, "medium": args.medium, "long": args.long, "xl": args.xl}
    samples = generate_samples(counts, seed, args.workers, str(args.tokenizer), args.max_len)
    print(f"[data] {describe(samples)}; {time.time() - t0:.1f}s", flush=True)
    pad, im_end = v1_train.token_id(tok, "<|endoftext|>"), v1_train.token_id(tok, "<|im_end|>")
    cfg = build_config(tok.get_vocab_size(), [im_end, pad], pad, toy=args.toy)
    fla_rc = 2
    if args.device.startswith("cuda") and not args.toy:  # fla's backward at v2's head dims, before training on it
        fla_rc = fla_gradcheck.check(args.device, cfg.linear_key_head_dim, cfg.linear_value_head_dim,
                                     cfg.linear_num_value_heads)
    init = args.resume if args.resume is not None else args.init
    model = (Qwen3_5MoeForCausalLM(cfg) if init is None else from_checkpoint(init, cfg)).to(args.device)
    if fla_rc != 0:  # transformers' torch path, its chunk size following each batch's length
        n = fla_gradcheck.unbind_fla(model)
        if fla_rc == 1:
            print(f"[model] WARNING: fla's gradients disagree here: the DeltaNet layers train on transformers' "
                  f"torch path ({n} bindings replaced; slower steps)", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[model] {n_params} parameters ({n_params * 2 / 1e6:.1f} MB in bf16); layers {cfg.layer_types}",
          flush=True)
    it = batches(samples, args.batch_tokens, pad, seed)
    if args.device.startswith("cuda"):
        set_experts_impl(model, next(it), args.device)
    run_loop(args, model, it, tok, t0, sched)


def run_loop(
    args: argparse.Namespace, model: Any, it: Any, tok: Tokenizer, t0: float, sched: Schedule | None = None
) -> None:
    opt = v1_train.make_optimizer(model, args.lr)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if args.device.startswith("cuda") else None
    t_start = time.time()
    train_budget = args.time_budget - (t_start - t0) - SAVE_RESERVE_S if args.time_budget > 0 else 0.0
    if args.time_budget > 0 and train_budget < 10:
        raise SystemExit(f"--time-budget {args.time_budget}s leaves {train_budget:.0f}s to train")
    recent: list[torch.Tensor] = []
    trained_tokens = 0
    model.train()
    step, mid_saved = 0, args.mid_out is None
    warmup = REWARM_STEPS if sched is not None and sched.runs else args.warmup
    run_s, spent = 0.0, False  # this run's training seconds; its own budget spent
    progress = sched.progress(0.0) if sched is not None else 0.0
    while step < args.steps and progress < 1.0 and not spent:
        batch = {k: v.to(args.device, non_blocking=True) for k, v in next(it).items()}
        out, ce_t = v1_train.train_step(model, opt, batch, lr_at(progress, step, args.lr, warmup), amp)
        recent = (recent + [ce_t])[-20:]
        trained_tokens += batch["input_ids"].numel()
        step += 1
        if step % 10 == 0 or step == 1:
            v1_train._sync(args.device)
            run_s = time.time() - t_start
            spent = train_budget > 0 and run_s >= train_budget
            if sched is not None:
                progress = sched.progress(run_s)
            else:
                progress = run_s / train_budget if train_budget > 0 else step / args.steps
        if step % 50 == 0 or step == 1:
            rows, width = batch["input_ids"].shape
            print(f"[train] step {step} ce {ce_t.item():.4f} aux {out.aux_loss.item():.4f} "
                  f"lr {opt.param_groups[0]['lr']:.2e} batch {rows}x{width} {trained_tokens / 1e6:.0f}M tok "
                  f"{time.time() - t0:.0f}s", flush=True)
        if not mid_saved and progress >= 0.5:
            save_checkpoint(model, tok, args.mid_out, MAX_POSITIONS)
            mid_saved = True
    model.eval()
    save_checkpoint(model, tok, args.out, MAX_POSITIONS)
    final = torch.stack(recent).mean().item()
    if sched is not None:
        v1_train._sync(args.device)
        run_s = time.time() - t_start
        sched.history.append({"run": sched.runs + 1, "seed": args.seed + sched.runs, "steps": step,
                              "seconds": round(run_s, 1), "loss": round(final, 4),
                              "lr_end": opt.param_groups[0]["lr"], "date": time.strftime("%Y-%m-%d")})  # fmt: skip
        sched.done_s, sched.runs = sched.done_s + run_s, sched.runs + 1
        sched.steps, sched.tokens = sched.steps + step, sched.tokens + trained_tokens
        sched.save(args.out)
        print(f"[schedule] run {sched.runs}: {sched.done_s:.0f} of {sched.total_s:.0f} s trained "
              f"({min(1.0, sched.progress(0.0)):.0%}), {sched.steps} steps in all", flush=True)
    usage = expert_usage(model, [next(it) for _ in range(2)], args.device)
    print(format_usage(usage), flush=True)
    print(f"[done] final loss (assistant-token CE, mean of the last {len(recent)} steps) {final:.4f}; steps {step}; "
          f"{trained_tokens / max(1e-9, time.time() - t_start) / 1e3:.0f}k padded tok/s; "
          f"total time {time.time() - t0:.0f}s", flush=True)


@torch.no_grad()
def expert_usage(model: Any, batches_: list[dict[str, torch.Tensor]], device: str) -> torch.Tensor:
    """[layers, E] share of top-k assignments per expert over the real (unpadded) tokens."""
    cfg = model.config
    counts = torch.zeros(cfg.num_hidden_layers, cfg.num_experts, dtype=torch.float64)
    for b in batches_:
        ids = b["input_ids"].to(device)
        keep = (b["labels"] != -100).reshape(-1).to(device) | (ids.reshape(-1) != cfg.pad_token_id)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
            out = model(input_ids=ids, output_router_logits=True)
        for layer, logits in enumerate(out.router_logits):
            top = logits.reshape(-1, cfg.num_experts)[keep].topk(cfg.num_experts_per_tok, dim=-1).indices.reshape(-1)
            counts[layer] += torch.bincount(top, minlength=cfg.num_experts).double().cpu()
    return counts / counts.sum(dim=1, keepdim=True)


if __name__ == "__main__":
    train(parse_args())
