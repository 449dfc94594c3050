"""The package layering holds (``ROWS`` below: the design's package map, top to bottom, as docs/architecture.md
draws it): a package imports only packages on lower rows, and packages on one row do not import each other.

Every ``import`` statement counts, wherever it stands: at module level, inside functions (lazy imports) and under
``if TYPE_CHECKING:`` (a type-only import still ties the two packages together: the reader of the lower one must
know the upper one). Registries of module names (``importlib`` strings) are lazy by design and not imports
here. Inside ``experts/`` the same rule orders its rooms: backends/ over slots/, cpu/ and prefill/ (prefill/
over slots/), all over the package's base modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "freetoken"

# The package map, top to bottom: a package may import only from rows below its own.
ROWS: list[tuple[str, ...]] = [
    ("cli", "bench"),
    ("server", "launch"),
    ("engine", "chat"),
    ("loader", "runner"),
    ("models",),
    ("layers",),
    ("experts", "cache"),
    ("kernels", "memory"),
    ("hardware",),
    ("checkpoint", "quant"),  # quant/: the weight formats, when quantised experts come
    ("config", "errors"),
]
ROW = {pkg: i for i, pkgs in enumerate(ROWS) for pkg in pkgs}
# experts/ inside: sub-package -> its row (the modules at experts/ top level form the last row).
EXPERTS_ROWS: list[tuple[str, ...]] = [
    ("backends",),
    ("prefill",),
    ("slots", "cpu"),
    ("base",),  # the modules at experts/ top level: base, host_pool, reference
]
EXPERTS_ROW = {pkg: i for i, pkgs in enumerate(EXPERTS_ROWS) for pkg in pkgs}


def _imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file, relative imports resolved."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    rel = path.relative_to(SRC.parent).with_suffix("")
    here = list(rel.parts[:-1])  # the package a relative import starts from (also for an __init__.py)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                mod = ".".join([*base, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            if (SRC.parent / mod.replace(".", "/")).is_dir():  # from a package: its names may be modules
                out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
    return out


# What the package root re-exports (``freetoken/__init__.py``, lazily): the package each name lives in.
ROOT_NAMES = {"LLM": "engine", "SamplingParams": "runner", "EngineConfig": "config", "__version__": None}


def _package(module: str) -> str | None:
    """freetoken.<package>[...] -> package (config and errors are modules); None for other modules."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "freetoken":
        return None
    return ROOT_NAMES.get(parts[1], parts[1]) if parts[1] in ROOT_NAMES else parts[1]


def _violations() -> list[str]:
    return [v for path in sorted(SRC.rglob("*.py")) for v in _file_violations(path)]


def _file_violations(path: Path, source: str | None = None) -> list[str]:
    """What one module (``source``: its text, when it exists only in a test) imports against the layering."""
    bad: list[str] = []
    rel = path.relative_to(SRC)
    if rel.parts == ("__init__.py",):
        return []  # the package root: the public API's lazy re-exports (LLM, SamplingParams, EngineConfig)
    mine = rel.parts[0].removesuffix(".py")
    assert mine in ROW, f"{rel}: package {mine!r} is not in DESIGN.md §3's rows (add it there and here)"
    seen: set[tuple[int, str | None]] = set()
    for line, module in _imports(path, source):
        other = _package(module)
        if other == mine == "experts":
            room = _room(module.split(".")[2:])
            if (line, room) not in seen:
                seen.add((line, room))
                bad += _experts_violation(rel, line, module)
            continue
        if (line, other) in seen:
            continue  # `from freetoken.x import y`: one finding per package and line
        seen.add((line, other))
        if other is None or other == mine:
            continue
        if other not in ROW:
            bad.append(f"{rel}:{line}: imports {module} (package {other!r} has no row)")
        elif ROW[other] <= ROW[mine]:
            how = "a package on its own row" if ROW[other] == ROW[mine] else "a higher row"
            bad.append(f"{rel}:{line}: {mine}/ imports {module}, {how}")
    return bad


def _room(parts: list[str]) -> str:
    """The room of experts/ a module path below it names: its sub-package, or "base" for top-level modules."""
    if not parts:
        return "base"
    return parts[0] if (SRC / "experts" / parts[0]).is_dir() else "base"


def _experts_violation(rel: Path, line: int, module: str) -> list[str]:
    mine = _room([p.removesuffix(".py") for p in rel.parts[1:]])
    other = _room(module.split(".")[2:])
    if other == mine or other not in EXPERTS_ROW or mine not in EXPERTS_ROW:
        return []
    if EXPERTS_ROW[other] < EXPERTS_ROW[mine] or (EXPERTS_ROW[other] == EXPERTS_ROW[mine] and other != mine
                                                   and mine not in EXPERTS_ROWS[-1]):  # fmt: skip
        return [f"{rel}:{line}: experts/{mine} imports {module}, a room above or beside it"]
    return []


def test_no_import_runs_back_up() -> None:
    bad = _violations()
    assert not bad, "layering (DESIGN.md §3) broken:\n" + "\n".join(bad)


def _probe(rel: str, source: str) -> list[str]:
    """The findings for a module that exists only here (nothing is written into the source tree)."""
    return [v.split(": ", 1)[1] for v in _file_violations(SRC / rel, source)]


def test_the_check_sees_imports_of_every_kind() -> None:
    """Type-only, lazy and relative imports are all found (a check that cannot fail is no check)."""
    got = _probe("checkpoint/probe.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                 "    from freetoken.engine.llm import LLM\ndef f():\n    import freetoken.models.base\n"
                 "    from ..experts import base\n")  # fmt: skip
    assert got == ["checkpoint/ imports freetoken.engine.llm, a higher row",
                   "checkpoint/ imports freetoken.models.base, a higher row",
                   "checkpoint/ imports freetoken.experts, a higher row"]  # fmt: skip


def test_the_check_orders_the_rooms_of_experts() -> None:
    got = _probe("experts/slots/probe.py", "from freetoken.experts.backends.registry import BACKENDS\n"
                 "from freetoken.experts.cpu import runner\nfrom freetoken.experts.base import ExpertBanks\n")
    assert got == ["experts/slots imports freetoken.experts.backends.registry, a room above or beside it",
                   "experts/slots imports freetoken.experts.cpu, a room above or beside it"]  # fmt: skip


def test_kernels_know_no_model() -> None:
    """kernels/ (row 8) imports nothing above it (layers, models, experts/, cache/) nor memory/ beside it."""
    got = _probe("kernels/probe.py", "from freetoken.layers.attention import Attention\n"
                 "import freetoken.experts.base\nfrom freetoken.memory import planner\nfrom freetoken import errors\n")
    assert got == ["kernels/ imports freetoken.layers.attention, a higher row",
                   "kernels/ imports freetoken.experts.base, a higher row",
                   "kernels/ imports freetoken.memory, a package on its own row"]  # fmt: skip
