"""The environment a test's child process (``python -m freetoken.cli ...``) runs with: this tree's src first, then
whatever the parent's PYTHONPATH held (the GPU box carries the server's and the oracle's wheels there), so a child
imports what the test process imports."""

from __future__ import annotations

import os
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def child_env(**extra: str) -> dict[str, str]:
    """os.environ with SRC put first on PYTHONPATH (the parent's entries kept, made absolute), plus ``extra``."""
    kept = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, *kept]), **extra}
