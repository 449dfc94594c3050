"""An untrained (randomly initialised) v2 checkpoint with v1's tokenizer and chat template: for checking the
mechanics of serving and evaluating v2 (the engine, the server, the SDK evaluation) before a trained one exists.

    python -m training.default_model_v2.untrained --out /tmp/v2untrained          # full size (13.4 M parameters)
    python -m training.default_model_v2.untrained --out /tmp/v2toy --toy          # toy size, seconds on a CPU
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import Qwen3_5MoeForCausalLM

from training.default_model import train as v1_train
from training.default_model.checkpoint_io import save_checkpoint
from training.default_model_v2.hybrid_config import MAX_POSITIONS, build_config
from training.default_model_v2.v1 import V1_TOKENIZER


def save_untrained(out: Path, toy: bool = False, seed: int = 0) -> Path:
    """The checkpoint train.py would write, with the initial weights (seeded); returns `out`."""
    tok = Tokenizer.from_file(str(V1_TOKENIZER))
    pad, im_end = v1_train.token_id(tok, "<|endoftext|>"), v1_train.token_id(tok, "<|im_end|>")
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(build_config(tok.get_vocab_size(), [im_end, pad], pad, toy=toy)).eval()
    save_checkpoint(model, tok, out, MAX_POSITIONS)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--toy", action="store_true", help="train.py --toy's size instead of the full one")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(f"[untrained] {save_untrained(a.out, a.toy, a.seed)}")


if __name__ == "__main__":
    main()
