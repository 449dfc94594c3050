"""Time one training step of the full v2 model per batch shape (the torch DeltaNet path, as train.py runs it
without fla): what a run of the curriculum would cost on this device.

    python -m training.default_model_v2.step_time --device cpu --shapes 16x256,1x4096,1x16384
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import Qwen3_5MoeForCausalLM

from training.default_model_v2 import fla_gradcheck
from training.default_model_v2.hybrid_config import build_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shapes", default="16x256,1x4096,1x16384", help="rows x tokens, comma-separated")
    ap.add_argument("--vocab", type=int, default=2048, help="v1's tokenizer's size")
    a = ap.parse_args()
    model = Qwen3_5MoeForCausalLM(build_config(a.vocab, [1, 0], 0)).to(a.device)
    fla_gradcheck.unbind_fla(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dev_type = torch.device(a.device).type
    for shape in a.shapes.split(","):
        rows, tokens = (int(n) for n in shape.split("x"))
        ids = torch.randint(0, a.vocab, (rows, tokens), device=a.device)
        for _ in range(2):  # the second is timed: the first allocates and warms up
            t0 = time.perf_counter()
            with torch.autocast(dev_type, dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            if dev_type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        print(f"{rows} x {tokens}: {dt:.2f} s a step, {rows * tokens / dt:.0f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
