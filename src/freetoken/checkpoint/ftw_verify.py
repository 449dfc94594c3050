"""FTW checksums (xxh3-64): computed when writing, checked at load (``--verify``) or in the background after
serving starts (the default).

A bank part read verbatim into the pool is hashed in memory (what the engine serves, no second read of the
disk); a part that was converted while loading, and every other file, is hashed from its file. A mismatch names
the file; in the background it is logged as an error and shown in the engine's stats (``weights_check``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import xxhash

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.ftw_io import byte_view
from freetoken.checkpoint.ftw_manifest import MANIFEST, FilePart, Manifest

log = logging.getLogger(__name__)

_STEP = 64 << 20  # bytes hashed per call (xxhash releases the GIL while it hashes)


def xxh3_of(view: memoryview) -> str:
    h = xxhash.xxh3_64()
    for at in range(0, len(view), _STEP):
        h.update(view[at : at + _STEP])
    return h.hexdigest()


def xxh3_of_file(path: Path, nbytes: int) -> str:
    h = xxhash.xxh3_64()
    left = nbytes
    with open(path, "rb") as f:
        while left > 0:
            chunk = f.read(min(_STEP, left))
            if not chunk:
                raise CheckpointError(f"{path}: ends {left} bytes early (truncated?)")
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


class WeightsCheck:
    """The checksums of one FTW load. ``in_memory``: bank name -> the pool tensor holding its bytes verbatim."""

    def __init__(self, manifest: Manifest, in_memory: dict[str, torch.Tensor]) -> None:
        self.manifest, self.in_memory = manifest, in_memory
        self.status = "pending"  # then "running", "ok" or "mismatch: <file> ..."
        self._thread: threading.Thread | None = None

    def _jobs(self) -> list[Callable[[], None]]:
        jobs: list[Callable[[], None]] = []
        for bank in self.manifest.banks:
            t = self.in_memory.get(bank.name)
            for p in bank.parts:
                jobs.append(lambda p=p, t=t: self._check(p, t))  # type: ignore[misc]
        jobs += [lambda p=p: self._check(p, None) for p in self.manifest.files]  # type: ignore[misc]
        return jobs

    def _check(self, part: FilePart, bank: torch.Tensor | None) -> None:
        path = self.manifest.directory / part.file
        got = xxh3_of(byte_view(bank, part.bank_offset, part.nbytes)) if bank is not None else xxh3_of_file(
            path, part.nbytes
        )
        if got != part.xxh3_64:
            raise CheckpointError(f"{path}: checksum mismatch (xxh3-64 {got}, {MANIFEST} says {part.xxh3_64}): "
                                  "the file is corrupt; convert the checkpoint again")  # fmt: skip

    def run(self, threads: int = 1) -> None:
        """Check everything now; the first mismatch raises ``CheckpointError`` naming its file."""
        self.status = "running"
        try:
            with ThreadPoolExecutor(max(1, threads), thread_name_prefix="ftw-verify") as pool:
                for _ in pool.map(lambda job: job(), self._jobs()):
                    pass
        except CheckpointError as e:
            self.status = f"mismatch: {e}"
            raise
        self.status = "ok"

    def start(self) -> None:
        """Check in a background thread (one core); a mismatch is logged as an error and kept in ``status``."""
        def body() -> None:
            try:
                self.run()
                log.info("%s: every FTW checksum matches", self.manifest.directory)
            except CheckpointError as e:
                log.error("WEIGHTS CORRUPT, outputs cannot be trusted: %s", e)
            except Exception as e:  # never let the check take the engine down
                self.status = f"error: {type(e).__name__}: {e}"
                log.error("the FTW checksum check failed: %s", self.status)

        self._thread = threading.Thread(target=body, name="ftw-verify", daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
