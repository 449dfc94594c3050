"""ft serve pins glibc's mmap threshold: large request-sized blocks go back to the system when freed."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = r"""
import sys, threading
import psutil
from freetoken.server.heap import pin_mmap_threshold

pinned = pin_mmap_threshold() if sys.argv[1] == "pin" else True
me = psutil.Process()

def bodies():
    for _ in range(6):  # a body, freed, then another of the same size: glibc's dynamic threshold case
        body = b"x" * (12 * 2**20)
        text = body.decode()
        del body, text

before = me.memory_info().rss
threads = [threading.Thread(target=bodies) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(pinned, (me.memory_info().rss - before) / 2**20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_pinned_threshold_returns_large_blocks() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD, "pin"], capture_output=True, text=True, timeout=60, check=True)
    pinned, growth = out.stdout.split()
    assert pinned == "True"
    assert float(growth) < 8, f"RSS grew {growth} MB after freeing every 12 MB block"
