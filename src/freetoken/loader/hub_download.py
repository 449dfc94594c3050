"""Download the files the engine reads of one Hugging Face repo revision into huggingface_hub's cache.

Order: ``config.json`` first, and the support check (``loader/hub_support.py``) before anything else is fetched;
then the safetensors index, the free-disk check against what is still missing, then the small files and the
weights, each through ``hf_hub_download``: resumable within a run (a dropped connection is resumed with a Range request
from the bytes on disk, retried as long as bytes keep coming) and across runs by file (the files already fetched
are kept; huggingface_hub 2 restarts a half-fetched file over HTTP, while Xet-stored files resume from Xet's chunk
cache); huggingface_hub's progress bar shows bytes and rate; it reads ``HF_TOKEN`` itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from freetoken.loader.hub_files import (
    CONFIG_FILES,
    INDEX_FILE,
    HubError,
    check_free_disk,
    small_files,
    total_bytes,
    weight_files,
)
from freetoken.loader.hub_ref import HubRef
from freetoken.loader.hub_support import support_of


def download(ref: HubRef, info: Any, cache_dir: Path, say: Callable[[str], None]) -> Path:
    """The snapshot directory of ``info`` (an ``HfApi.model_info(..., files_metadata=True)``) with every file the
    engine reads; a repo it cannot serve is refused after ``config.json``, before any weight byte."""
    from huggingface_hub import hf_hub_download

    commit = str(info.sha)
    siblings: dict[str, int | None] = {s.rfilename: s.size for s in (info.siblings or [])}
    if "config.json" not in siblings:
        raise HubError(f"{ref}: the repo has no config.json (not a transformers checkpoint)")

    def fetch(name: str) -> Path:
        path = Path(hf_hub_download(ref.repo_id, name, revision=commit, cache_dir=cache_dir))
        if path.parent.name != commit:  # a nested name (none are asked for) or a cache laid out otherwise
            raise HubError(f"{ref}: {name} landed in {path.parent}, not in the snapshot of {commit}")
        return path

    snapshot = fetch("config.json").parent
    _write_ref(cache_dir, ref, commit)
    for name in CONFIG_FILES[1:]:
        if name in siblings:
            fetch(name)
    support = support_of(snapshot)
    if not support.served:
        raise HubError(f"{ref}: this engine cannot serve it, nothing else downloaded ({support.reason})")
    index = json.loads(fetch(INDEX_FILE).read_text()) if INDEX_FILE in siblings else None
    weights = weight_files(str(ref), siblings, index)
    names = small_files(siblings) + weights
    missing = [n for n in names if not (snapshot / n).exists()]
    need = total_bytes(missing, siblings, index)
    check_free_disk(str(ref), cache_dir, need)
    if missing:
        say(f"downloading {ref.repo_id} at {commit[:12]}: {len(missing)} file(s), {need / 2**30:.2f} GiB "
            f"into {cache_dir}")  # fmt: skip
    for name in missing:
        fetch(name)
    return snapshot


def _write_ref(cache_dir: Path, ref: HubRef, commit: str) -> None:
    """Point the asked revision (a branch or tag) at the commit, as huggingface_hub does, so an offline run finds it
    (the files were fetched by commit, which writes no ref)."""
    if ref.revision is not None and ref.revision == commit:
        return
    refs = cache_dir / ref.folder / "refs" / (ref.revision or "main")
    refs.parent.mkdir(parents=True, exist_ok=True)
    if not refs.exists() or refs.read_text() != commit:
        refs.write_text(commit)
