"""A tiny random DeepSeek-V4 checkpoint for tests (``models/deepseek_v4.py``), saved with transformers' own
``save_pretrained``: 4 layers of every attention kind (heavily compressed at rate 8, compressed sparse at rate 4 with
an indexer of 16 heads keeping 3 entries: enough heads that no entry scores exactly 0, a tie; sliding), an 8-token
window, the first two layers routed by token id (``tid2eid``: a random table of distinct experts), 4 residual
streams; the multi-token-prediction block DeepSeek ships (``mtp.0.*``) is appended to the safetensors, as the real
checkpoint carries it. The reference tests' case on it (``reference_case``: prompts, transformers' greedy
continuations checked free of near-ties, the logits at every position) and the engine on it in float32
(``dsv4_llm``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from freetoken import LLM
from freetoken.bench.tiny_hybrid import randomize
from reference import INDEX_MARGIN, LOGIT_MARGIN, ROUTER_MARGIN, RefRun, margins, reference_greedy, torch_ops

HCA, CSA, SLIDING = "heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention"
TINY: dict[str, Any] = dict(
    vocab_size=512, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4, head_dim=32,
    q_lora_rank=32, num_experts_per_tok=2, n_routed_experts=8, layer_types=[HCA, CSA, SLIDING, CSA],
    compress_rates={CSA: 4, HCA: 8}, hc_mult=4, sliding_window=8, o_groups=2, o_lora_rank=16, index_n_heads=16,
    index_head_dim=16, index_topk=3, mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
    partial_rotary_factor=0.25, max_position_embeddings=512, routed_scaling_factor=1.5,
)  # fmt: skip


def make_model(seed: int, **over: Any) -> Any:
    import transformers as tf

    torch.manual_seed(seed)
    model = randomize(tf.AutoModelForCausalLM.from_config(tf.DeepseekV4Config(**{**TINY, **over}),
                                                          dtype=torch.float32), seed)  # fmt: skip
    g = torch.Generator().manual_seed(seed + 1)
    cfg = model.config
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
            elif name.endswith("tid2eid"):
                ranks = torch.rand((cfg.vocab_size, cfg.n_routed_experts), generator=g).argsort(dim=-1)
                b.copy_(ranks[:, : cfg.num_experts_per_tok])
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.copy_(torch.randn(p.shape, generator=g) + 1.0)
    return model


def add_mtp(directory: Path, hidden: int) -> list[str]:
    """DeepSeek's multi-token-prediction block beside the decoder's tensors (a few of its names): the loader must skip
    it. Returns the names added."""
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(path)
    mtp = {"mtp.0.enorm.weight": torch.ones(hidden), "mtp.0.hnorm.weight": torch.ones(hidden),
           "mtp.0.e_proj.weight": torch.zeros(hidden, hidden),
           "mtp.0.attn.wkv.weight": torch.zeros(32, hidden)}  # fmt: skip
    save_file({**tensors, **mtp}, path, metadata={"format": "pt"})
    return sorted(mtp)


def save_dsv4_checkpoint(directory: Path, seed: int, **over: Any) -> Any:
    model = make_model(seed, **over)
    model.save_pretrained(directory)
    add_mtp(Path(directory), model.config.hidden_size)
    return model


SEED = 0
PROMPT_LENGTHS = (5, 13, 29)
STEPS = 16  # the longest context reaches 45 tokens: 11 CSA entries (3 kept), 5 HCA entries, windows of 8


def reference_case(d: Path) -> tuple[Path, Any, list[RefRun], list[torch.Tensor]]:
    """The checkpoint of seed ``SEED`` saved in ``d``, the model, the greedy references of prompts of
    ``PROMPT_LENGTHS`` tokens (``STEPS`` tokens each) and the logits at every position of prompt + continuation."""
    model = save_dsv4_checkpoint(d, SEED)
    g = torch.Generator().manual_seed(1000 + SEED)
    prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    refs = [reference_greedy(model, p, STEPS) for p in prompts]
    for r in refs:  # the near-tie rule: this seed must be free of ties, else pick another seed
        assert r.min_logit_margin > LOGIT_MARGIN, f"seed has a logit near-tie ({r.min_logit_margin:.2g})"
        router, index = margins(model, r.prompt + r.tokens)
        assert router > ROUTER_MARGIN, f"seed has a router near-tie ({router:.2g})"
        assert index > INDEX_MARGIN, f"seed has an indexer near-tie ({index:.2g})"
    with torch.no_grad(), torch_ops(model):  # logits at every position of prompt + continuation
        full = [model(torch.tensor([r.prompt + r.tokens]), use_cache=False).logits[0].float() for r in refs]
    return d, model, refs, full


def dsv4_llm(d: Path, backend: str = "fused", cache: float | None = None, fill: float | None = None, **kw: Any) -> LLM:
    return LLM(model=str(d), device="cpu", dtype="float32", moe_backend=backend, expert_cache=cache, fill_fraction=fill,
               **kw)  # fmt: skip
