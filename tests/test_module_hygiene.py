"""Modules of ``src/freetoken`` meet through public names only, and never import each other round a loop.

Three checks, each over every module, each with a probe proving it sees a planted violation:

- **No import cycle between modules.** The graph has an edge for every ``import`` statement wherever it stands
  (module level, inside a function, under ``if TYPE_CHECKING:``): ``import a.b``, ``from a import b`` (to ``a.b``
  when ``b`` is a submodule, else to ``a``, i.e. its ``__init__``), and a package's ``__init__`` importing its own
  submodules. The parent packages Python runs implicitly before a submodule are not edges (every submodule
  would then loop through its own package). A loop is reported as a chain ``a:line -> b:line -> a``.
- **No import of another module's private name**: ``from freetoken.x import _name`` (one leading underscore;
  dunders and private submodules are not private names here).
- **No reach into another module's private attribute**: ``obj._name`` where ``obj`` is not ``self``/``cls`` and
  ``_name`` is defined only in other freetoken modules (a ``def``, a class-level or ``self._name`` assignment,
  a module-level name). ``_name`` defined in the reading module too is taken to be its own object's; chains
  rooted in an external library (``torch._C``) are out of scope.
"""

from __future__ import annotations

import ast
from collections import deque
from functools import cache
from pathlib import Path
from textwrap import dedent

SRC = Path(__file__).resolve().parents[1] / "src" / "freetoken"


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _from_base(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` statement reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    here = _module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]  # a module's relative imports start from its package
    base = here[: len(here) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(path: Path, tree: ast.AST, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) for every module of ``known`` an import statement of the file names."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(path, node)
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((node.lineno, sub if sub in known else base))
    return [(line, m) for line, m in out if m in known]


def _parse(path: Path, source: str | None = None) -> ast.AST:
    return ast.parse(path.read_text() if source is None else source, filename=str(path))


@cache
def _tree_files() -> tuple[Path, ...]:
    return tuple(sorted(SRC.rglob("*.py")))


# ---- 1. import cycles ---------------------------------------------------------------------------------------------

Graph = dict[str, dict[str, int]]  # module -> {imported module: first line importing it}


def _graph(extra: dict[Path, str] | None = None) -> Graph:
    """The module graph of the source tree; ``extra``: modules (path -> text) that exist only in a test."""
    sources: dict[Path, str | None] = {p: None for p in _tree_files()}
    sources.update(extra or {})
    known = {_module_name(p) for p in sources}
    graph: Graph = {}
    for path, text in sources.items():
        me = _module_name(path)
        edges = graph.setdefault(me, {})
        for line, other in _targets(path, _parse(path, text), known):
            if other != me:
                edges[other] = min(line, edges.get(other, line))
    return graph


def _sccs(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, {}))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(graph.get(w, {})))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return out


def _path(graph: Graph, start: str, goal: str, inside: set[str]) -> list[str]:
    """A shortest path start -> ... -> goal through modules of ``inside`` (BFS)."""
    prev: dict[str, str] = {start: start}
    todo = deque([start])
    while todo:
        v = todo.popleft()
        if v == goal:
            break
        for w in sorted(graph.get(v, {})):
            if w in inside and w not in prev:
                prev[w] = v
                todo.append(w)
    path = [goal]
    while path[-1] != start:
        path.append(prev[path[-1]])
    return path[::-1]


def _cycles(graph: Graph) -> list[str]:
    """Each loop as a readable chain; enough loops that every edge inside a tangle appears in one."""
    chains: list[str] = []
    short = len("freetoken.")
    for comp in _sccs(graph):
        inside = set(comp)
        left = {(a, b) for a in comp for b in graph[a] if b in inside}
        while left:
            a, b = min(left)
            loop = [a, *_path(graph, b, a, inside)]
            left -= set(zip(loop, loop[1:]))
            hops = [f"{m[short:]}:{graph[m][n]}" for m, n in zip(loop, loop[1:])]
            chains.append(" -> ".join([*hops, loop[-1][short:]]))
    return chains


def test_no_import_cycle_between_modules() -> None:
    loops = _cycles(_graph())
    assert not loops, f"{len(loops)} import loop(s) (module:line of the import -> ...):\n" + "\n".join(loops)


def test_the_cycle_check_sees_a_planted_loop() -> None:
    """A type-only import, a package's __init__ importing its submodule and a lazy import close one loop."""
    planted = {
        SRC / "errors_probe.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                 "    from freetoken.probe_pkg import Thing\n",
        SRC / "probe_pkg" / "__init__.py": "from .thing import Thing\n",
        SRC / "probe_pkg" / "thing.py": "class Thing:\n    def f(self):\n        from freetoken import errors_probe\n",
    }  # fmt: skip
    found = [c for c in _cycles(_graph(planted)) if "probe" in c]  # the tree's own loops are the test above's
    assert found == ["errors_probe:3 -> probe_pkg:1 -> probe_pkg.thing:3 -> errors_probe"]


# ---- 2. private names imported -------------------------------------------------------------------------------------


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_imports(path: Path, source: str | None = None) -> list[str]:
    """``from <freetoken module> import _name`` statements of one file (private submodules are modules, fine)."""
    known = {_module_name(p) for p in _tree_files()}
    bad: list[str] = []
    for node in ast.walk(_parse(path, source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = _from_base(path, node)
        if base.split(".")[0] != "freetoken":
            continue
        for a in node.names:
            if _private(a.name) and f"{base}.{a.name}" not in known:
                bad.append(f"{path.relative_to(SRC)}:{node.lineno}: imports {a.name} from {base}")
    return bad


def test_no_module_imports_another_modules_private_name() -> None:
    bad = [v for path in _tree_files() for v in _private_imports(path)]
    assert not bad, "private names imported across modules (make the name public or move it):\n" + "\n".join(bad)


def test_the_private_import_check_sees_a_planted_import() -> None:
    got = _private_imports(SRC / "server" / "probe.py", "from .protocol import _Conversation, __all__, Public\n"
                           "def f():\n    from freetoken.engine.engine import _step\n")  # fmt: skip
    assert got == ["server/probe.py:1: imports _Conversation from freetoken.server.protocol",
                   "server/probe.py:3: imports _step from freetoken.engine.engine"]  # fmt: skip


# ---- 3. private attributes reached into ----------------------------------------------------------------------------


def _defined(tree: ast.AST) -> set[str]:
    """Private names a module defines: at module level, in class bodies, as ``self._x``/``cls._x`` targets, and
    as keywords of its calls (``parser.set_defaults(_run=...)`` gives the namespace it builds a ``_run``)."""
    names: set[str] = set()

    def body(stmts: list[ast.stmt]) -> None:
        for st in stmts:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(st.name)
                if isinstance(st, ast.ClassDef):
                    body(st.body)
            elif isinstance(st, (ast.Assign, ast.AnnAssign)):
                targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(st, (ast.If, ast.Try)):
                body([*st.body, *st.orelse, *getattr(st, "finalbody", [])])

    body(getattr(tree, "body", []))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
            names.add(node.attr)
        elif isinstance(node, ast.Call):
            names.update(k.arg for k in node.keywords if k.arg)
    return {n for n in names if _private(n)}


def _is_self(node: ast.expr) -> bool:
    """``self``, ``cls``, ``super()`` or ``type(self)``: the object's own class, wherever it was defined."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id == "super" or (node.func.id == "type" and len(node.args) == 1 and _is_self(node.args[0]))
    return False


def _external_aliases(tree: ast.AST) -> set[str]:
    """Names bound by imports of other libraries (``torch``, ``np``): chains rooted there are out of scope."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] != "freetoken")
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] != "freetoken":
            out.update(a.asname or a.name for a in node.names)
    return out


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _definers(sources: dict[Path, str]) -> dict[str, frozenset[str]]:
    """Private name -> the modules (paths relative to ``SRC``) that define it."""
    out: dict[str, set[str]] = {}
    for path, text in sources.items():
        for name in _defined(_parse(path, text)):
            out.setdefault(name, set()).add(str(path.relative_to(SRC)))
    return {k: frozenset(v) for k, v in out.items()}


@cache
def _tree_definers() -> dict[str, frozenset[str]]:
    return _definers({p: p.read_text() for p in _tree_files()})


def _private_reaches(
    path: Path, source: str | None = None, definers: dict[str, frozenset[str]] | None = None
) -> list[str]:
    """``obj._name`` reads and writes of one file where ``_name`` belongs to other freetoken modules only."""
    definers = _tree_definers() if definers is None else definers
    tree = _parse(path, source)
    mine, external, rel = _defined(tree), _external_aliases(tree), str(path.relative_to(SRC))
    bad: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)) or _is_self(node.value):
            continue
        owners = definers.get(node.attr, frozenset()) - {rel}
        if node.attr in mine or not owners or _root(node.value) in external:
            continue
        what = f"{ast.unparse(node.value)}.{node.attr}"
        bad.append((node.lineno, f"{rel}:{node.lineno}: {what} (private to {', '.join(sorted(owners))})"))
    return [v for _, v in sorted(bad)]


def test_no_module_reaches_into_another_modules_private_attribute() -> None:
    bad = [v for path in _tree_files() for v in _private_reaches(path)]
    assert not bad, "private attributes read across modules (add a public method or pass it in):\n" + "\n".join(bad)


def test_the_private_attribute_check_sees_a_planted_reach() -> None:
    """A read and a write into another module's object are found; self, cls, the module's own and torch's are not."""
    owner = "class Tree:\n    _C = 0\n    def __init__(self):\n        self._nodes, self._own = [], 0\n"
    reader = dedent("""\
        import torch
        class Mine:
            def __init__(self):
                self._own = 1
            def f(self, other, tok):
                self._x = other._own
                tok._C = None
                return torch._C, tok.tree._nodes(), type(self)._own
        """)
    definers = _definers({SRC / "cache" / "probe.py": owner, SRC / "chat" / "probe.py": reader})
    assert _private_reaches(SRC / "chat" / "probe.py", reader, definers) == [
        "chat/probe.py:7: tok._C (private to cache/probe.py)",
        "chat/probe.py:8: tok.tree._nodes (private to cache/probe.py)",
    ]
