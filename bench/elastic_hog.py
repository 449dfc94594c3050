"""The other program of ``bench/elastic_timeline.py``: a process that grows (torch allocations of ``CHUNK``,
retried while the device refuses them) or shrinks to each byte count it reads on stdin, and prints what it
holds. ``Hog`` starts and drives one."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

CHUNK = 256 << 20


def hog_main() -> int:
    """Reads target byte counts on stdin; grows (chunks, retrying while refused) or shrinks to each; prints
    ``held <bytes> <refusals>`` every 50 ms."""
    import torch

    target, refused = [0], 0
    held: list[Any] = []
    torch.cuda.init()

    def reader() -> None:
        for line in sys.stdin:
            target[0] = int(line.strip() or 0)

    threading.Thread(target=reader, daemon=True).start()
    last = 0.0
    while True:
        want, have = target[0], len(held) * CHUNK
        if want < 0:
            return 0
        if have + CHUNK <= want:
            try:
                held.append(torch.empty(CHUNK, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                refused += 1
                time.sleep(0.01)
        elif have > want:
            while len(held) * CHUNK > want:
                held.pop()
            torch.cuda.empty_cache()
        else:
            time.sleep(0.005)
        now = time.monotonic()
        if now - last > 0.05:
            print(f"held {len(held) * CHUNK} {refused}", flush=True)
            last = now


class Hog:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)  # fmt: skip
        self.held, self.refused, self.target = 0, 0, 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            _, held, refused = line.split()
            self.held, self.refused = int(held), int(refused)

    def want(self, nbytes: int) -> None:
        self.target = nbytes
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{nbytes}\n")
        self.proc.stdin.flush()

    def wait_held(self, timeout: float) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if abs(self.held - self.target) < CHUNK:
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        self.want(-1)
        self.proc.wait(10)


if __name__ == "__main__":
    sys.exit(hog_main())
