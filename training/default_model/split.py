"""Held-out split by construction: a stable hash of a canonical key decides train vs held-out.

The same key always lands on the same side, so a held-out operand pair, city, path or expression
can never appear as a training question, whatever the seed or the number of samples.
"""

from __future__ import annotations

import hashlib

# Share of keys held out, per kind (out of 100).
HELDOUT_PERCENT = {"arith": 10, "city": 20, "path": 15, "expr": 15, "tool": 25}  # "tool": v2 only


def _bucket(key: str) -> int:
    """A stable value in [0, 100) for `key` (sha256; independent of PYTHONHASHSEED)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:4], "big") % 100


def arith_key(op: str, a: int, b: int) -> str:
    """Canonical key of an arithmetic question; add and mul are commutative, so the pair is sorted."""
    if op in ("add", "mul"):
        a, b = min(a, b), max(a, b)
    return f"arith:{op}:{a}:{b}"


def is_heldout(kind: str, key: str) -> bool:
    """True when `key` (of kind arith/city/path/expr) belongs to the held-out evaluation side."""
    return _bucket(f"{kind}|{key}") < HELDOUT_PERCENT[kind]
