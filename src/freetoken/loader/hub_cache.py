"""What huggingface_hub's cache holds (``scan_cache_dir``), each snapshot with what this engine makes of it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from freetoken.loader.hub_support import Support, support_of


@dataclass(frozen=True)
class CachedModel:
    repo_id: str
    revision: str  # its refs ("main", a tag), else the commit's first 12 hex digits
    size_bytes: int  # on disk (blobs counted once)
    path: Path  # the snapshot directory: ``--model`` takes it, or the repo id
    support: Support


def cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def cached_models() -> list[CachedModel]:
    """Every model snapshot in the cache, by repo id then revision; an absent cache is empty."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(cache_dir())
    except CacheNotFound:
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for rev in sorted(repo.revisions, key=lambda r: sorted(r.refs)):
            name = ",".join(sorted(rev.refs)) or rev.commit_hash[:12]
            out.append(CachedModel(repo.repo_id, name, rev.size_on_disk, Path(rev.snapshot_path),
                                   support_of(Path(rev.snapshot_path))))  # fmt: skip
    return out
