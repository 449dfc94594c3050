"""Re-prefilled tokens after each agent-harness edit on a tiny Qwen3.5-MoE (the turns of
tests/test_state_checkpoints.py), with state checkpoints at anchors and with none (full recompute). CPU, fp32,
page size 4. Prints a markdown table.

    PYTHONPATH=src python3 bench/hybrid_edits.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from freetoken import LLM, SamplingParams  # noqa: E402
from freetoken.bench.agent_edits import common_prefix  # noqa: E402
from test_state_checkpoints import _ANCHOR_TOKENS, PAGE, _turns  # noqa: E402
from tiny_models import save_checkpoint, save_tokenizer  # noqa: E402


def main() -> None:
    d = Path(tempfile.mkdtemp())
    save_checkpoint("qwen3_5_moe", d, seed=2)
    tok = save_tokenizer(d)
    first, edits = _turns({t: tok.convert_tokens_to_ids(t) for t in _ANCHOR_TOKENS})
    p = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    print("| edit | prompt | new suffix (minimum) | re-prefilled, anchors | re-prefilled, no checkpoints |")
    print("|---|---|---|---|---|")
    for name, prompt in edits.items():
        row = []
        for checkpoints in (16, 0):
            llm = LLM(model=str(d), device="cpu", dtype="float32", page_size=PAGE, state_checkpoints=checkpoints)
            llm.generate([first], p)
            before = llm.stats()["prefill_tokens"]
            llm.generate([prompt], p)
            row.append(llm.stats()["prefill_tokens"] - before)
        print(f"| {name} | {len(prompt)} | {len(prompt) - common_prefix(first, prompt)} | {row[0]} | {row[1]} |")


if __name__ == "__main__":
    main()
