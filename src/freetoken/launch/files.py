"""Config-file plumbing shared by the agents: read, merge, diff, back up and write.

A :class:`FileChange` is computed first (old text, new text) and applied later, so
``--dry-run`` can print exactly the diff that a real run would write. Applying a change
copies the old file to ``<name>.<timestamp>.bak`` before writing, and a change that would
leave the file as it is writes nothing (running ``ft launch`` twice makes one backup).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class FileChange:
    path: Path
    old_text: str | None  # None: the file does not exist yet
    new_text: str
    note: str = ""  # shown with the diff, e.g. "comments are not kept"

    @property
    def changed(self) -> bool:
        return self.old_text != self.new_text

    def diff(self) -> str:
        old = [] if self.old_text is None else self.old_text.splitlines(keepends=True)
        new = self.new_text.splitlines(keepends=True)
        a = "/dev/null" if self.old_text is None else str(self.path)
        lines = list(difflib.unified_diff(old, new, fromfile=a, tofile=str(self.path)))
        return "".join(x if x.endswith("\n") else x + "\n" for x in lines)


def read_text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def backup_path(path: Path, stamp: str | None = None) -> Path:
    """``<name>.<YYYYmmdd-HHMMSS>.bak``, with ``-N`` added if that name is taken."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    candidate = path.with_name(f"{path.name}.{stamp}.bak")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.{stamp}-{n}.bak")
        n += 1
    return candidate


def apply_change(change: FileChange) -> Path | None:
    """Back up (if the file exists) and write one change; returns the backup path.

    A symlinked config (dotfile managers) is written through: the link stays a link.
    """
    if not change.changed:
        return None
    target = change.path.resolve() if change.path.is_symlink() else change.path
    target.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    if target.exists():
        backup = backup_path(change.path)
        shutil.copy2(target, backup)
    # Write to a temporary file and rename: a crash never leaves a half-written config.
    tmp = target.with_name(f".{target.name}.ft-tmp")
    tmp.write_text(change.new_text, encoding="utf-8")
    if target.exists():
        shutil.copymode(target, tmp)
    os.replace(tmp, target)
    return backup


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in: nested mappings merge, everything else replaces."""
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


# JSON5 subset read by `loads_json5`: // and /* */ comments, trailing commas, unquoted
# identifier keys and single-quoted strings: what hand-edited JSON5 configs use.
_TOKEN = re.compile(
    r"""(?P<dq>"(?:[^"\\]|\\.)*")|(?P<sq>'(?:[^'\\]|\\.)*')|(?P<lc>//[^\n]*)|(?P<bc>/\*.*?\*/)"""
    r"""|(?P<comma>,(?=\s*(?:(?://[^\n]*|/\*.*?\*/)\s*)*[}\]]))"""
    r"""|(?P<key>(?<=[{,\s])[A-Za-z_$][A-Za-z0-9_$]*(?=\s*:))""",
    re.S,
)


def _json5_token(m: re.Match[str]) -> str:
    kind = m.lastgroup
    text = m.group(0)
    if kind == "dq":
        return text
    if kind == "sq":  # 'x' -> "x": unescape \' and escape bare double quotes
        body = text[1:-1].replace("\\'", "'")
        return '"' + re.sub(r'(?<!\\)"', '\\"', body) + '"'
    if kind in ("lc", "bc", "comma"):
        return ""
    return json.dumps(text)  # unquoted key


def loads_json5(text: str) -> Any:
    """Parse JSON or the common JSON5 subset (see above); raises ``ValueError`` otherwise."""
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(_TOKEN.sub(_json5_token, text))
