"""Which files of a Hugging Face repo the engine reads, and whether they fit on the disk.

Only top-level files: the config, the generation config, the tokenizer and chat-template files, and the safetensors
shards the index names (or the one ``model.safetensors``); never duplicate trees such as ``original/`` nor other
weight formats (``*.bin``, GGUF) the loader does not read.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from freetoken.checkpoint.errors import CheckpointError

CONFIG_FILES = ("config.json", "hf_quant_config.json")  # read before anything else: the support check
INDEX_FILE = "model.safetensors.index.json"
SMALL_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "tiktoken.model",  # Kimi: the vocabulary as tiktoken ranks (checkpoint/tiktoken_tokenizer.py converts it)
    "chat_template.jinja",
    "chat_template.json",
)
DISK_MARGIN = 1 << 30  # left free after the download: the cache's metadata, logs, the rest of the system


class HubError(CheckpointError):
    """A Hugging Face repo that cannot be fetched or served as it is: one line saying why."""


def small_files(siblings: Mapping[str, int | None]) -> list[str]:
    """The non-weight files the engine reads that this repo has."""
    return [n for n in SMALL_FILES if n in siblings]


def weight_files(what: str, siblings: Mapping[str, int | None], index: Mapping[str, Any] | None) -> list[str]:
    """The safetensors files the loader reads: those the index names, else the single ``model.safetensors``."""
    if index is not None:
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, Mapping) or not weight_map:
            raise HubError(f"{what}: {INDEX_FILE} has no weight_map")
        names = sorted({str(v) for v in weight_map.values()})
        missing = [n for n in names if n not in siblings]
        if missing:
            raise HubError(f"{what}: {INDEX_FILE} names {missing[0]}, which the repo does not have")
        return names
    if "model.safetensors" in siblings:
        return ["model.safetensors"]
    others = sorted(n for n in siblings if n.endswith((".bin", ".gguf", ".pt", ".pth")) and "/" not in n)
    said = f" (it has {', '.join(others[:3])})" if others else ""
    raise HubError(f"{what}: no safetensors weights at the top level{said}: only safetensors checkpoints are read")


def total_bytes(names: list[str], siblings: Mapping[str, int | None], index: Mapping[str, Any] | None) -> int:
    """What ``names`` weigh: the repo's file sizes, or the index's ``total_size`` where the listing has none."""
    sizes = [siblings.get(n) for n in names]
    if all(s is not None for s in sizes):
        return sum(int(s or 0) for s in sizes)
    meta = (index or {}).get("metadata") or {}
    return int(meta.get("total_size") or 0) + sum(int(s or 0) for s in sizes)


def check_free_disk(what: str, cache_dir: Path, need: int) -> None:
    """Refuse a download that would not fit (``need`` bytes still to fetch, plus a margin) before it starts."""
    probe = cache_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need + DISK_MARGIN > free:
        raise HubError(
            f"{what}: needs {need / 2**30:.1f} GiB (+ {DISK_MARGIN / 2**30:.0f} GiB margin) in {cache_dir}, which has "
            f"{free / 2**30:.1f} GiB free; free some space or set HF_HUB_CACHE to a larger disk"
        )
