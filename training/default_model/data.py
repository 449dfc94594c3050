"""Generate, render and tokenise the training set; pack it into padded, length-bucketed batches."""

from __future__ import annotations

import random
from collections.abc import Iterator
from multiprocessing import Pool

import numpy as np
import torch
from tokenizers import Tokenizer

from training.default_model.generate import training_conversations
from training.default_model.render import pieces

CHUNK = 2000  # conversations per generation chunk; chunk c is seeded by (seed, c), so workers don't matter
PAD_MULTIPLE = 32
Pieces = list[tuple[str, bool]]


def _chunk(args: tuple[int, int, int]) -> list[Pieces]:
    seed, chunk, n = args
    return [pieces(c) for c in training_conversations(n, seed * 100_003 + chunk)]


def generate_pieces(n: int, seed: int, workers: int) -> list[Pieces]:
    """n conversations rendered into (text, trainable) pieces, in a worker-count-independent order."""
    jobs = [(seed, c, min(CHUNK, n - c * CHUNK)) for c in range((n + CHUNK - 1) // CHUNK)]
    if workers <= 1:
        chunks = [_chunk(j) for j in jobs]
    else:
        with Pool(workers) as pool:
            chunks = pool.map(_chunk, jobs)
    return [p for ch in chunks for p in ch]


def tokenize(tok: Tokenizer, convs: list[Pieces], max_len: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each conversation → (ids [L] int32, trainable [L] bool); each piece is encoded on its own,
    as the prompt and the generated turn are at inference. Longer than max_len: dropped."""
    flat = [t for conv in convs for t, _ in conv]
    enc = tok.encode_batch(flat, add_special_tokens=False)
    out, k = [], 0
    for conv in convs:
        ids: list[int] = []
        mask: list[bool] = []
        for _, trainable in conv:
            e = enc[k].ids
            k += 1
            ids += e
            mask += [trainable] * len(e)
        if len(ids) <= max_len and any(mask):
            out.append((np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=bool)))
    return out


def batches(samples: list[tuple[np.ndarray, np.ndarray]], batch_size: int, pad_id: int, seed: int,
            ) -> Iterator[dict[str, torch.Tensor]]:
    """Endless epochs of batches; samples of similar length go together to cut padding.

    Yields input_ids / attention_mask / labels, each [B, T]; labels are -100 outside assistant turns.
    """
    rng = random.Random(seed)
    while True:
        order = list(range(len(samples)))
        rng.shuffle(order)
        groups = []
        for s in range(0, len(order), batch_size * 64):
            block = sorted(order[s:s + batch_size * 64], key=lambda i: len(samples[i][0]))
            groups += [block[j:j + batch_size] for j in range(0, len(block), batch_size)]
        rng.shuffle(groups)
        for g in groups:
            yield _collate([samples[i] for i in g], pad_id)


def _collate(items: list[tuple[np.ndarray, np.ndarray]], pad_id: int) -> dict[str, torch.Tensor]:
    t = -(-max(len(ids) for ids, _ in items) // PAD_MULTIPLE) * PAD_MULTIPLE  # few distinct shapes
    ids = torch.full((len(items), t), pad_id, dtype=torch.long)
    att = torch.zeros((len(items), t), dtype=torch.long)
    labels = torch.full((len(items), t), -100, dtype=torch.long)
    for r, (x, m) in enumerate(items):
        xt = torch.from_numpy(x.astype(np.int64))
        ids[r, :len(x)] = xt
        att[r, :len(x)] = 1
        labels[r, :len(x)] = torch.where(torch.from_numpy(m), xt, torch.tensor(-100))
    return {"input_ids": ids, "attention_mask": att, "labels": labels}
