"""A small TOML writer and a table-level editor that keeps the rest of a file untouched.

The standard library reads TOML (``tomllib``) but cannot write it. Agent configs are
hand-edited files full of comments, so edits go through :func:`set_tables`: it replaces
only the text of the tables we own and checks, by parsing the result, that the file now
means exactly "old settings + our tables". Only when a file is laid out in a way a
text edit cannot handle (our table given as dotted keys or an inline table) does it fall
back to re-serialising the whole document with :func:`dumps` (comments are then lost;
the caller keeps a backup).
"""

from __future__ import annotations

import copy
import datetime as dt
import re
import sys
from collections.abc import Mapping
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as a package (pyproject pins it for 3.10 only)
    import tomli as tomllib

loads = tomllib.loads
TOMLDecodeError = tomllib.TOMLDecodeError

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")  # fullmatch: "$" would accept a trailing newline
# A table header line: [a.b] or [[a.b]] (keys possibly quoted), with an optional comment.
_HEADER = re.compile(r"^\s*\[(\[)?\s*(?P<path>[^\[\]]+?)\s*\](\])?\s*(#.*)?$")


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(s: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters (DEL too) escaped."""
    out = []
    for c in s:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif c < " " or c == "\x7f":
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _key(k: str) -> str:
    return k if _BARE_KEY.fullmatch(k) else _string(k)


def _value(v: Any) -> str:
    """One value in inline form (used for scalars, arrays and inline tables)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, dt.datetime | dt.date | dt.time):
        return v.isoformat()
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and len(v) > 0 and all(isinstance(x, Mapping) for x in v)


def _emit_table(path: list[str], table: Mapping[str, Any], out: list[str], header: bool) -> None:
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, Mapping) and not _is_table_array(v)]
    subtables = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
    arrays = [(k, v) for k, v in table.items() if _is_table_array(v)]
    # A header is needed when the table holds values, or is empty (else it would vanish).
    if header and (scalars or not (subtables or arrays)):
        out.append(("\n" if out else "") + "[" + ".".join(_key(p) for p in path) + "]")
    for k, v in scalars:
        out.append(f"{_key(k)} = {_value(v)}")
    for k, v in subtables:
        _emit_table([*path, k], v, out, header=True)
    for k, items in arrays:
        for item in items:
            out.append(("\n" if out else "") + "[[" + ".".join(_key(p) for p in [*path, k]) + "]]")
            _emit_table([*path, k], item, out, header=False)


def dumps(doc: Mapping[str, Any]) -> str:
    """Serialise a parsed TOML document (as ``tomllib`` returns it) back to TOML text."""
    out: list[str] = []
    _emit_table([], doc, out, header=False)
    return "\n".join(out) + "\n" if out else ""


def _parse_path(raw: str) -> tuple[str, ...] | None:
    """Split a header's dotted key into its parts; None if it is not one we can read."""
    try:
        parsed = tomllib.loads(f"{raw} = 0")
    except tomllib.TOMLDecodeError:
        return None
    parts: list[str] = []
    node: Any = parsed
    while isinstance(node, dict) and len(node) == 1:
        ((k, node),) = node.items()
        parts.append(k)
    return tuple(parts)


def _table_spans(lines: list[str]) -> list[tuple[tuple[str, ...] | None, int, int]]:
    """(header path, first line, end line) of every table; the preamble has path ()."""
    heads: list[tuple[tuple[str, ...] | None, int]] = [((), 0)]
    in_multiline = False
    for i, line in enumerate(lines):
        # Skip header-looking lines inside multi-line strings (an odd count of ''' / """).
        if line.count('"""') % 2 == 1 or line.count("'''") % 2 == 1:
            in_multiline = not in_multiline
            continue
        if in_multiline:
            continue
        m = _HEADER.match(line)
        if m:
            heads.append((_parse_path(m.group("path")), i))
    spans = []
    for j, (path, start) in enumerate(heads):
        end = heads[j + 1][1] if j + 1 < len(heads) else len(lines)
        spans.append((path, start, _own_end(lines, start, end)))
    return spans


def _own_end(lines: list[str], start: int, end: int) -> int:
    """End of a table's own lines: comments just above the next header belong to that one."""
    j = end
    while j > start + 1 and (not lines[j - 1].strip() or lines[j - 1].lstrip().startswith("#")):
        j -= 1
    if not any(line.lstrip().startswith("#") for line in lines[j:end]):
        return end
    while not lines[j].strip():  # blank lines before that comment go with this table
        j += 1
    return j


Tables = Mapping[tuple[str, ...], Mapping[str, Any] | None]


def merged(doc: Mapping[str, Any], tables: Tables) -> dict[str, Any]:
    """The document with each listed table replaced (a mapping) or removed (None).

    Removing a table also drops parents it leaves empty (a text edit that deletes
    ``[a.b]`` leaves no ``a`` behind either).
    """
    out = copy.deepcopy(dict(doc))
    for path, value in tables.items():
        chain = [out]
        for p in path[:-1]:
            child = chain[-1].get(p)
            if not isinstance(child, dict):
                if value is None:
                    break
                child = chain[-1][p] = {}
            chain.append(child)
        else:
            if value is not None:
                chain[-1][path[-1]] = copy.deepcopy(dict(value))
            elif path[-1] in chain[-1]:
                del chain[-1][path[-1]]
                for depth in range(len(chain) - 1, 0, -1):  # prune parents left empty
                    if chain[depth]:
                        break
                    del chain[depth - 1][path[depth - 1]]
    return out


def set_tables(text: str, tables: Tables) -> str:
    """Replace (or with None, remove) whole tables in TOML text, keeping everything else.

    Each table value must hold only scalars/arrays (no sub-tables). Raises
    ``tomllib.TOMLDecodeError`` when ``text`` is not valid TOML: a broken file is never
    rewritten.
    """
    want = merged(tomllib.loads(text), tables)
    lines = text.splitlines()
    spans = _table_spans(lines)
    drop: set[int] = set()
    insert_at: dict[int, list[str]] = {}
    appended: list[str] = []
    for path, value in tables.items():
        # Our table, plus any of its sub-tables ([a.b.c] under [a.b]) that the old file had.
        mine = [s for s in spans if s[0] is not None and s[0][: len(path)] == path and len(s[0]) >= len(path)]
        block = [] if value is None else _block(path, value)
        if mine:
            for _, start, end in mine:
                drop.update(range(start, end))
            insert_at.setdefault(mine[0][1], []).extend(block)
        elif block:
            appended.extend(["", *block])
    new_lines: list[str] = []
    for i, line in enumerate(lines):
        new_lines.extend(insert_at.get(i, []))
        if i not in drop:
            new_lines.append(line)
    new_lines.extend(appended)
    candidate = "\n".join(new_lines).strip("\n") + "\n"
    try:
        if tomllib.loads(candidate) == want:
            return candidate
    except tomllib.TOMLDecodeError:
        pass
    return dumps(want)  # layout we cannot edit in place: rewrite the whole document


def _block(path: tuple[str, ...], table: Mapping[str, Any]) -> list[str]:
    lines = ["[" + ".".join(_key(p) for p in path) + "]"]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items()]
    return [*lines, ""]
