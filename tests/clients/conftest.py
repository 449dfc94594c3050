"""The agent-client tests run only in .ci/run's clients stage (``FT_CLIENTS=1``): they install ~1 GB of npm
packages and start three real agents, which the main test run should not pay for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("FT_CLIENTS") == "1":
        return
    skip = pytest.mark.skip(reason="real agent clients: run with FT_CLIENTS=1 (.ci/run's clients stage)")
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(skip)
