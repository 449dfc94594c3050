"""``docs/architecture.md`` stays a map one can read and trust: at most 400 lines of at most 120 characters, and
every repository path it cites exists. README.md and docs/*.md cite nothing outside the repository.

A citation is an inline code span (``like/this.py``), or a word of one (``bash bench/gpu/run.sh graphs``), that
looks like a path: a file ending in .py, .md, .sh or .toml, or a folder written with its trailing ``/``. It
resolves against the repository root, ``src/freetoken/``, the folders the same line cited before it (a table
row's ``chat/`` then ``grammar/`` then ``compose.py``) and the folders cited in the headings above it
(``## `experts/`, room by room``). Globs (``tests/test_*.py``) match at least one file; placeholders
(``tools/<family>.py``), URLs, absolute paths and MIME types (``text/plain``) are not citations.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "freetoken"
MAP = ROOT / "docs" / "architecture.md"
MAX_LINES, MAX_WIDTH = 400, 120

CODE_SPAN = re.compile(r"(`+)(.+?)\1")
PATH_WORD = re.compile(r"[\w.*?\-]+(/[\w.*?\-]+)*/?")
FILE_SUFFIXES = (".py", ".md", ".sh", ".toml")
HEADING = re.compile(r"^(#+)\s")


def _looks_like_path(word: str) -> bool:
    """A file with a cited suffix or a folder with its /; not a flag, and not ``../`` (the outside check's)."""
    if not PATH_WORD.fullmatch(word) or word.startswith(("-", "../")):
        return False
    return word.endswith("/") or word.endswith(FILE_SUFFIXES)


def _citations(line: str) -> list[str]:
    """The path-like words of the line's code spans, in order."""
    words = [w.strip(",;:") for span in CODE_SPAN.finditer(line) for w in span.group(2).split()]
    return [w for w in words if _looks_like_path(w)]


def _resolve(cited: str, bases: list[Path]) -> list[Path]:
    """Every existing match of ``cited`` under one of ``bases`` (a glob: its first match in each)."""
    hits: list[Path] = []
    for base in bases:
        if any(ch in cited for ch in "*?"):
            hit = next(iter(sorted(base.glob(cited.rstrip("/")))), None)
        else:
            hit = base / cited
        if hit is not None and (hit.is_dir() if cited.endswith("/") else hit.exists()) and hit not in hits:
            hits.append(hit)
    return hits


def dead_citations(text: str) -> list[str]:
    """``line: path`` for every citation that resolves nowhere."""
    dead: list[str] = []
    headings: list[tuple[int, list[Path]]] = []  # (level, folders cited in that heading)
    for n, line in enumerate(text.splitlines(), 1):
        heading = HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            headings = [h for h in headings if h[0] < level]
        context = [d for _, dirs in headings for d in dirs]
        found: list[Path] = []
        for cited in _citations(line):
            hits = _resolve(cited, [*found, *context, ROOT, SRC])
            if not hits:
                dead.append(f"{n}: {cited}")
            found += [h if h.is_dir() else h.parent for h in hits]  # `bench/` is both the root's and the package's
        if heading:
            headings.append((level, found))
    return dead


def _outside(doc: Path, text: str) -> list[str]:
    """``../`` citations that leave the repository: links resolve from the doc's folder, other text from the root."""
    bad: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        links = {m.start(1) for m in re.finditer(r"\]\((\.\./[^)\s]*)", line)}
        for m in re.finditer(r"(?<![\w.])\.\./[^\s`)\]'\"]*", line):
            base = doc.parent if m.start() in links else ROOT
            if not (base / m.group()).resolve().is_relative_to(ROOT):
                bad.append(f"{doc.relative_to(ROOT)}:{n}: {m.group()}")
    return bad


def test_the_map_is_short_and_narrow() -> None:
    lines = MAP.read_text().splitlines()
    wide = [f"{n}: {len(line)} characters" for n, line in enumerate(lines, 1) if len(line) > MAX_WIDTH]
    assert len(lines) <= MAX_LINES, f"docs/architecture.md has {len(lines)} lines (at most {MAX_LINES})"
    assert not wide, f"docs/architecture.md lines over {MAX_WIDTH} characters:\n" + "\n".join(wide)


def test_every_path_the_map_cites_exists() -> None:
    dead = dead_citations(MAP.read_text())
    assert not dead, "docs/architecture.md cites paths that do not exist (line: path):\n" + "\n".join(dead)


def test_the_docs_cite_nothing_outside_the_repository() -> None:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    bad = [b for doc in docs for b in _outside(doc, doc.read_text())]
    assert not bad, "paths outside the repository (../) cited:\n" + "\n".join(bad)


def test_the_path_check_reads_citations_as_meant() -> None:
    """Dead paths are found; folders, globs, row and heading context, commands and non-paths are read right."""
    text = (
        "| `chat/` | `grammar/` then `compose.py`; `tools/<family>.py`, `text/plain`, `/v1/models` |\n"
        "Run `bash bench/gpu/run.sh graphs`; tests in `tests/test_*.py`; `https://x.org/a.py`.\n"
        "## `experts/`, room by room\n"
        "`slots/gemm.py`, `slots/nothing.py`, `compose.py`\n"
        "## Next\n"
        "`slots/`, `src/freetoken/config.py/`, `tests/test_nothing_*.py`, `README.md`\n"
    )
    assert dead_citations(text) == [
        "4: slots/nothing.py",
        "4: compose.py",  # chat/grammar/ was the first line's context, not this one's
        "6: slots/",  # the experts/ heading's context ended at the next heading of its level
        "6: src/freetoken/config.py/",  # a trailing / is a folder
        "6: tests/test_nothing_*.py",
    ]


def test_the_outside_check_tells_links_from_text() -> None:
    text = "[readme](../README.md) and `../shared/DESIGN.md`, [x](../../x.md), bash ../shared/b.sh\n"
    assert _outside(ROOT / "docs" / "probe.md", text) == [
        "docs/probe.md:1: ../shared/DESIGN.md",
        "docs/probe.md:1: ../../x.md",
        "docs/probe.md:1: ../shared/b.sh",
    ]
