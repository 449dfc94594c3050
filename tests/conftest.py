"""Test setup: skip GPU tests without CUDA. (The helpers, tiny_models, reference, devices, are importable through
pyproject's pytest `pythonpath`: src, tests and the repository root, which holds `training` and `bench`.)"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    _own_cpus_per_xdist_worker()


def _own_cpus_per_xdist_worker() -> None:
    """Under pytest-xdist (the GPU box runs -n 8 and -n 14 on 16 cores) each worker takes its own slice of the CPUs
    (2 at least), so the engines it starts size and pin their CPU expert kernels to that slice: before, every worker
    pinned 15 kernel threads onto the same 15 cores and engine tests ran past their 300 s timeout. Child processes
    inherit the slice. One process (CI) keeps every CPU."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or not hasattr(os, "sched_setaffinity"):
        return
    cpus, n, i = sorted(os.sched_getaffinity(0)), int(count), int(worker.removeprefix("gw"))
    k, start = min(len(cpus), max(2, len(cpus) // n)), (i * len(cpus)) // n
    os.sched_setaffinity(0, {cpus[(start + j) % len(cpus)] for j in range(k)})
    torch.set_num_threads(k)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def freetoken_env(monkeypatch: pytest.MonkeyPatch):
    """``set(name, value)``: set one of FreeToken's environment variables for this test; ``config.env()``, read
    once per process, is re-read now and again after the test."""
    from freetoken.config import env

    def set_var(name: str, value: str) -> None:
        monkeypatch.setenv(name, value)
        env.cache_clear()

    yield set_var
    env.cache_clear()


@pytest.fixture(scope="module")
def one_intra_op_thread():
    """Tiny ops: waking torch's intra-op threads on a loaded 2-core machine costs more than the ops.
    Modules opt in with ``pytestmark = pytest.mark.usefixtures("one_intra_op_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """The tiny tokenizer of the scripted-engine server tests (read-only: one per session)."""
    from scripted_engine import build_tokenizer

    return build_tokenizer(str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[bytes, int]]:
    """A directory with a trained ``tiktoken.model`` and Kimi's tokenizer_config.json (``tiktoken_files.py``), and the
    ranks: the tiktoken tests' checkpoint."""
    from tiktoken_files import write_kimi_tokenizer

    d = tmp_path_factory.mktemp("kimi_tok")
    return d, write_kimi_tokenizer(d)


@pytest.fixture(scope="module")
def kimi_enc(kimi_dir: tuple[Path, dict[bytes, int]]) -> Any:
    """The ``tiktoken`` library's encoding of ``kimi_dir``'s ranks: the tiktoken tests' oracle."""
    from tiktoken_files import reference_encoding

    return reference_encoding(kimi_dir[1])


def _triton_interpreter_numpy_shim() -> None:
    """Triton 3.6's interpreter turns a one-element block into an index with ``int(array)``, which NumPy
    2.4 refuses for 1-d arrays; the same through ``.item()`` (tests only: the interpreter is our CPU
    stand-in for the GPU)."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):  # type: ignore[no-untyped-def]
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
    _round_bf16_to_nearest(interpreter)


def _round_bf16_to_nearest(interpreter: Any) -> None:
    """The interpreter casts float32 to bf16 by truncation; the GPU rounds to nearest even, as torch does: bf16
    kernels in the interpreter get torch's cast."""
    import numpy as np
    import triton.language as tl

    original = interpreter.InterpreterBuilder.cast_impl

    def cast(self, src, dst_type):  # type: ignore[no-untyped-def]
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            data = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32)).to(torch.bfloat16)
            return interpreter.TensorHandle(data.view(torch.int16).numpy().view(np.uint16), dst_type.scalar)
        return original(self, src, dst_type)

    interpreter.InterpreterBuilder.cast_impl = cast


_triton_interpreter_numpy_shim()


# ``ft launch``'s tests (test_launch*.py; their harness: launch_harness.py): a fake server of models, a dead port and
# a temporary HOME with a PATH of fakes
@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A fake ``ft serve`` on loopback serving ``launch_harness.MODELS`` (a module's own ``server`` wins)."""
    from launch_harness import ModelsHandler

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), ModelsHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on once this socket closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def box(tmp_path: Path) -> dict[str, Any]:
    """A temporary HOME, an empty bin/ for PATH, and the env the launcher runs with."""
    home, bindir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bindir.mkdir()
    env = {
        "HOME": str(home),
        "PATH": str(bindir),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
        "FT_RECORD": str(tmp_path / "record.json"),
    }
    return {"home": home, "bin": bindir, "env": env, "record": tmp_path / "record.json"}
