"""``--model ORG/NAME[@REVISION]`` (and ``LLM("ORG/NAME")``) -> a local checkpoint directory.

An existing local directory of that path wins. Otherwise the repo is fetched with ``huggingface_hub`` into its cache
(``loader/hub_download.py``: only what the engine reads, refused before any weight byte when the engine cannot serve
it); offline (``HF_HUB_OFFLINE=1``, or the Hub cannot be reached) the cached snapshot is used, and said so. A gated
or private repo and an unknown revision get one line each. A process resolves each name once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from freetoken.loader.hub_download import download
from freetoken.loader.hub_files import INDEX_FILE, HubError
from freetoken.loader.hub_ref import COMMIT, HubRef, parse_ref

_resolved: dict[tuple[str, str, str], Path] = {}


def _stderr(line: str) -> None:
    print(f"FreeToken: {line}", file=sys.stderr, flush=True)


def resolve_model(spec: str, say: Callable[[str], None] = _stderr) -> Path:
    """The checkpoint directory ``spec`` names: a local directory as it is, a Hugging Face repo id from the cache,
    downloaded first where needed. A path that is neither comes back as it is (the loader names it missing)."""
    local = Path(spec).expanduser()
    ref = parse_ref(spec)
    if local.is_dir() or ref is None:
        return local
    from huggingface_hub import constants

    key = (spec, str(constants.HF_HUB_CACHE), str(constants.ENDPOINT))
    if key not in _resolved:
        _resolved[key] = _fetch(ref, Path(constants.HF_HUB_CACHE), say)
    return _resolved[key]


def forget_resolved() -> None:
    """Resolve every name afresh (tests that change the Hub or the cache under one name)."""
    _resolved.clear()


def _fetch(ref: HubRef, cache_dir: Path, say: Callable[[str], None]) -> Path:
    from huggingface_hub import HfApi, constants

    if constants.HF_HUB_OFFLINE:
        return _cached(ref, cache_dir, "offline (HF_HUB_OFFLINE=1)", say)
    from huggingface_hub.errors import HfHubHTTPError

    try:
        info = HfApi().model_info(ref.repo_id, revision=ref.revision, files_metadata=True)
    except Exception as e:
        if _is_network(e):
            return _cached(ref, cache_dir, f"the Hub cannot be reached ({type(e).__name__})", say)
        if isinstance(e, HfHubHTTPError):
            raise _hub_error(ref, e) from e
        raise
    try:
        return download(ref, info, cache_dir, say)
    except Exception as e:
        if _is_network(e):  # huggingface_hub resumed with Range requests while bytes came, then gave up
            raise HubError(f"{ref}: the download was interrupted ({type(e).__name__}: {e}); run again: the files "
                           "already fetched are kept") from e  # fmt: skip
        if isinstance(e, HfHubHTTPError):
            raise _hub_error(ref, e) from e
        raise


def _network_errors() -> tuple[type[BaseException], ...]:
    transport: type[BaseException]
    try:  # huggingface_hub 2 speaks httpx2, 1.x httpx
        import httpx2  # type: ignore[import-not-found, unused-ignore]

        transport = httpx2.TransportError
    except ImportError:
        import httpx

        transport = httpx.TransportError
    from huggingface_hub.errors import OfflineModeIsEnabled

    return (transport, OfflineModeIsEnabled, ConnectionError, TimeoutError)


def _is_network(e: BaseException) -> bool:
    from huggingface_hub.errors import LocalEntryNotFoundError

    if isinstance(e, LocalEntryNotFoundError):  # hf_hub_download: the file is not cached and the Hub unreachable
        return isinstance(e.__cause__ or e.__context__, _network_errors())
    return isinstance(e, _network_errors())


def _hub_error(ref: HubRef, e: Exception) -> HubError:
    """One line for what the Hub refused."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    page = f"https://huggingface.co/{ref.repo_id}"
    if isinstance(e, GatedRepoError):
        return HubError(f"{ref.repo_id} is gated: accept its terms at {page} and set HF_TOKEN to a token of that "
                        "account")  # fmt: skip
    if isinstance(e, RevisionNotFoundError):
        return HubError(f"{ref.repo_id} has no revision {ref.revision!r} (a branch, tag or commit of the repo)")
    if isinstance(e, RepositoryNotFoundError):
        return HubError(f"{ref.repo_id}: no such local directory, and no Hugging Face repo of that name that this "
                        "token can see (a private repo needs HF_TOKEN)")  # fmt: skip
    response = getattr(e, "response", None)
    status = getattr(response, "status_code", None)
    if status in (401, 403):
        return HubError(f"{ref.repo_id}: access refused ({status}): set HF_TOKEN to a token with access to {page}")
    return HubError(f"{ref}: the Hub answered {status}: {str(e).splitlines()[0]}")


def _cached(ref: HubRef, cache_dir: Path, why: str, say: Callable[[str], None]) -> Path:
    """The cached snapshot of ``ref`` when the Hub is not asked; complete or refused."""
    repo = cache_dir / ref.folder
    commit = ref.revision if ref.revision and COMMIT.fullmatch(ref.revision) else None
    head = repo / "refs" / (ref.revision or "main")
    if commit is None and head.is_file():
        commit = head.read_text().strip()
    snapshot = repo / "snapshots" / commit if commit else None
    if snapshot is None or not (snapshot / "config.json").is_file():
        raise HubError(f"{ref}: {why}, and it is not in the cache ({cache_dir}); download it once online")
    missing = [n for n in _index_files(snapshot) if not (snapshot / n).is_file()]
    if missing:
        raise HubError(f"{ref}: {why}, and the cached copy lacks {missing[0]} (an interrupted download?); "
                       "finish it online")  # fmt: skip
    say(f"{why}: using the cached {ref} (commit {snapshot.name[:12]})")
    return snapshot


def _index_files(snapshot: Path) -> list[str]:
    index = snapshot / INDEX_FILE
    if not index.is_file():
        return [] if (snapshot / "model.safetensors").is_file() else ["model.safetensors"]
    weight_map: dict[str, Any] = json.loads(index.read_text()).get("weight_map") or {}
    return sorted({str(v) for v in weight_map.values()})
