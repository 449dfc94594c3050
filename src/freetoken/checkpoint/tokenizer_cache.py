"""Converted tokenizers kept on disk: a ``tiktoken.model`` checkpoint's ``tokenizer.json`` (seconds to build for a
160k vocabulary, ``checkpoint/tiktoken_tokenizer.py``) under ``<FREETOKEN_CACHE>/tokenizers/<key>/``.

The key is the SHA-256 of the converter's version, the control-token block's size, ``tiktoken.model`` and
``tokenizer_config.json``: a changed input or converter is a new entry. Beside ``tokenizer.json`` lies
``tokenizer.json.sha256``, its own hash, written after it; an entry whose file does not hash to the record
(truncated, edited, half-written) is rebuilt, never read. Both files are written to a temporary name and renamed,
so a reader sees a whole file or none. A cache that cannot be written (read-only disk) costs a conversion per
start, nothing else.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freetoken.checkpoint.tiktoken_tokenizer import (
    CONFIG_FILE,
    TIKTOKEN_FILE,
    build_tokenizer,
    read_spec,
    reserved_tokens,
)

log = logging.getLogger(__name__)

CONVERTER_VERSION = b"freetoken-tiktoken-1"  # bump when the conversion's output changes
JSON_FILE = "tokenizer.json"
HASH_FILE = "tokenizer.json.sha256"


def cache_key(directory: Path, reserved: int | None = None) -> str:
    """SHA-256 (hex) of the converter version, the control-token block's size and the two files the conversion
    reads."""
    block = reserved_tokens(directory) if reserved is None else reserved
    h = hashlib.sha256(CONVERTER_VERSION + b"\0reserved=%d" % block)
    for name in (TIKTOKEN_FILE, CONFIG_FILE):
        data = (directory / name).read_bytes()
        h.update(b"\0%s\0%d\0" % (name.encode(), len(data)))
        h.update(data)
    return h.hexdigest()


def cache_root(cache_dir: str | None = None) -> Path:
    from freetoken.config import env

    return Path(cache_dir or env().cache_dir) / "tokenizers"


@dataclass(frozen=True)
class Converted:
    """A converted tokenizer's JSON and where it came from: ``"hit"`` (the cache, verified), ``"built"`` (converted
    and stored), ``"uncached"`` (converted; the cache could not be written)."""

    text: str
    source: str


def converted_tokenizer(directory: Path, config: Mapping[str, Any], cache_dir: str | None = None) -> Converted:
    """The converted ``tokenizer.json`` text of a ``tiktoken.model`` directory (``config``: its parsed
    ``tokenizer_config.json``), from the cache or built (and stored). The text handed back is the text whose hash
    was checked, not the file read again."""
    reserved = reserved_tokens(directory)
    entry = cache_root(cache_dir) / cache_key(directory, reserved)
    cached = _verified(entry)
    if cached is not None:
        return Converted(cached, "hit")
    log.info("converting %s to a tokenizers BPE (cached afterwards)", directory / TIKTOKEN_FILE)
    text = str(build_tokenizer(read_spec(directory, config, reserved)).to_str())
    data = text.encode()
    try:
        entry.mkdir(parents=True, exist_ok=True)
        _write_atomic(entry / JSON_FILE, data)
        _write_atomic(entry / HASH_FILE, hashlib.sha256(data).hexdigest().encode())
    except OSError as e:
        log.warning("cannot cache the converted tokenizer in %s (%s); converting on every start", entry, e)
        return Converted(text, "uncached")
    return Converted(text, "built")


def _verified(entry: Path) -> str | None:
    """The cached JSON when it hashes to its record; None when absent, unreadable or not matching."""
    path, record = entry / JSON_FILE, entry / HASH_FILE
    if not path.exists():
        return None
    try:
        want = record.read_text().strip()
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() == want:
            return data.decode()
    except (OSError, UnicodeDecodeError):
        pass
    log.warning("%s does not match its recorded hash (truncated or edited): converting again", path)
    return None


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
