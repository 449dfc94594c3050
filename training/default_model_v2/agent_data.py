"""v2's training set: v1's short tasks plus agent-shaped conversations in three length classes, tokenised with
v1's tokenizer in worker processes, then cut into token-budget batches (a length curriculum: no long batch in
the first LONG_START of an epoch).

Chunk c of class k is seeded by (seed, k, c), so the data does not depend on the number of workers.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from functools import lru_cache
from multiprocessing import Pool

import numpy as np
import torch
from tokenizers import Tokenizer

from training.default_model.data import tokenize
from training.default_model.generate import training_conversations
from training.default_model.render import pieces
from training.default_model_v2.agent_tasks import agent_conversation

CHUNK = {"short": 2000, "medium": 100, "long": 20, "xl": 5}
# Prompt sizes (tokens asked of agent_conversation; the rendered prompt comes out a little longer).
LENGTHS = {"medium": (1000, 7000), "long": (7000, 36000), "xl": (40000, 62000)}
AGENT_MIX = {"tool": 0.6, "missing": 0.12, "arith": 0.14, "chat": 0.14}
PAD_MULTIPLE = 64
LONG_FROM = 8192  # a batch whose rows are longer than this is "long" for the curriculum
LONG_START = 0.15
Sample = tuple[np.ndarray, np.ndarray]


@lru_cache(maxsize=1)
def _tokenizer(path: str) -> Tokenizer:
    return Tokenizer.from_file(path)


def agent_conversations(n: int, seed: int, lengths: tuple[int, int]) -> list[dict]:
    rng = random.Random(seed)
    tasks, weights = list(AGENT_MIX), list(AGENT_MIX.values())
    lo, hi = lengths
    return [agent_conversation(rng, int(math.exp(rng.uniform(math.log(lo), math.log(hi)))),
                               rng.choices(tasks, weights)[0], with_result=rng.random() < 0.7) for _ in range(n)]


def _call_text(msg: dict) -> str:
    """A history call as the template renders it before the last query (no thinking, empty content)."""
    fn = msg["tool_calls"][0]["function"]
    args = json.dumps(fn["arguments"], ensure_ascii=False)
    return f'<tool_call>\n{{"name": "{fn["name"]}", "arguments": {args}}}\n</tool_call><|im_end|>'


def agent_pieces(conv: dict) -> list[tuple[str, bool]]:
    """v1's pieces (the turns after the last query are trained) with the history's `_train` calls trained too:
    each is found, in order, in the context right after its `<|im_start|>assistant\n` and cut out as trainable.
    They teach the call at many depths of a long prompt; thinking is absent there, as the template renders it."""
    targets = [_call_text(m) for m in conv["messages"] if m.get("_train")]
    out: list[tuple[str, bool]] = []
    for text, trainable in pieces(conv):
        pos = 0
        while targets and not trainable:
            j = text.find("<|im_start|>assistant\n" + targets[0], pos)
            if j < 0:
                break
            start = j + len("<|im_start|>assistant\n")
            out += [(text[pos:start], False), (targets[0], True)]
            pos = start + len(targets.pop(0))
        out.append((text[pos:], trainable))
    return [(t, m) for t, m in out if t]


def _chunk(job: tuple[str, int, int, int, str, int]) -> list[Sample]:
    kind, seed, chunk, n, tok_path, max_len = job
    chunk_seed = seed * 100_003 + chunk + 7_919 * list(CHUNK).index(kind) * 1_000_003
    if kind == "short":
        split = [pieces(c) for c in training_conversations(n, chunk_seed)]
    else:
        split = [agent_pieces(c) for c in agent_conversations(n, chunk_seed, LENGTHS[kind])]
    return tokenize(_tokenizer(tok_path), split, max_len)


def generate_samples(counts: dict[str, int], seed: int, workers: int, tok_path: str, max_len: int,
                     ) -> list[Sample]:
    """counts: conversations per class (short, medium, long, xl) → tokenised samples, in a fixed order."""
    jobs = [(k, seed, c, min(CHUNK[k], n - c * CHUNK[k]), tok_path, max_len)
            for k, n in counts.items() for c in range((n + CHUNK[k] - 1) // CHUNK[k])]
    if workers <= 1:
        chunks = [_chunk(j) for j in jobs]
    else:
        with Pool(workers) as pool:
            chunks = pool.map(_chunk, jobs, chunksize=1)
    return [s for ch in chunks for s in ch]


def _padded(n: int) -> int:
    return -(-n // PAD_MULTIPLE) * PAD_MULTIPLE


def plan_epoch(lengths: list[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Batches of similar-length samples, rows x padded length <= batch_tokens, in curriculum order."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and (len(cur) + 1) * _padded(lengths[i]) > batch_tokens:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    keys = []
    for g in groups:
        u = rng.random()
        keys.append(LONG_START + (1 - LONG_START) * u if lengths[g[-1]] > LONG_FROM else u)
    return [g for _, g in sorted(zip(keys, groups), key=lambda kg: kg[0])]


def batches(samples: list[Sample], batch_tokens: int, pad_id: int, seed: int) -> Iterator[dict[str, torch.Tensor]]:
    """Endless epochs. Rows are right-padded and there is no attention mask: every mixer is causal, so a real
    token never sees the padding after it (and the attention layers keep the fast causal kernel)."""
    rng = random.Random(seed)
    lengths = [len(x) for x, _ in samples]
    while True:
        for g in plan_epoch(lengths, batch_tokens, rng):
            yield collate([samples[i] for i in g], pad_id)


def collate(items: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    t = _padded(max(len(x) for x, _ in items))
    ids = torch.full((len(items), t), pad_id, dtype=torch.long)
    labels = torch.full((len(items), t), -100, dtype=torch.long)
    for r, (x, m) in enumerate(items):
        xt = torch.from_numpy(x.astype(np.int64))
        ids[r, :len(x)] = xt
        labels[r, :len(x)] = torch.where(torch.from_numpy(m), xt, torch.tensor(-100))
    return {"input_ids": ids, "labels": labels}


def describe(samples: list[Sample]) -> str:
    n = np.array([len(x) for x, _ in samples])
    trained = sum(int(m.sum()) for _, m in samples)
    edges = [0, 2048, 8192, 16384, 40960, 1 << 30]
    hist = ", ".join(f"{a}-{b if b < 1 << 30 else 'max'}: {int(((n > a) & (n <= b)).sum())}"
                     for a, b in zip(edges, edges[1:]))
    return (f"{len(samples)} samples, {int(n.sum())} tokens ({trained} trained), longest {int(n.max())}; "
            f"by length {hist}")
