"""Write the model directory: bf16 safetensors shards (<= 15 MiB each) + index, configs, tokenizer."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import Qwen3MoeForCausalLM

from training.default_model.tokenizer_train import MODEL_MAX_LENGTH, write_tokenizer_files

MAX_SHARD_BYTES = 15 * 2**20
SHARD_SIZE = "15MB"  # save_pretrained's own accounting; checked against MAX_SHARD_BYTES below


def save_checkpoint(model: Qwen3MoeForCausalLM, tok: Tokenizer, out_dir: Path,
                    model_max_length: int = MODEL_MAX_LENGTH) -> None:
    """Save in the Hugging Face layout (per-expert gate/up/down tensors), bf16. v2 passes its hybrid model and
    its 64k context."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in [*out_dir.glob("model*.safetensors"), *out_dir.glob("model.safetensors.index.json")]:
        old.unlink()  # a retrain into the same directory must not leave shards of another split
    bf16: Any = copy.deepcopy(model)  # a copy: Module.to() is in place and would round the live weights
    bf16.to(torch.bfloat16).save_pretrained(out_dir, max_shard_size=SHARD_SIZE)
    del bf16
    for shard in out_dir.glob("*.safetensors"):
        size = shard.stat().st_size
        if size > MAX_SHARD_BYTES:
            raise RuntimeError(f"{shard.name} is {size} bytes > 15 MiB")
    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["num_experts"] = cfg.get("num_local_experts", cfg.get("num_experts"))  # the name Qwen3 hub configs use
    cfg["dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    gen = {"eos_token_id": [im_end, eot], "pad_token_id": eot, "do_sample": False, "max_new_tokens": 256}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    write_tokenizer_files(tok, out_dir, model_max_length)
