"""What a CUDA graph capture refuses, checked on the CPU (``forbid_capture_breakers``): ops that read a device value
on the host, make a data-dependent shape, draw from a generator's state, or make a tensor from host data inside the
captured region. On CUDA these synchronise mid-capture ("operation not permitted when stream is capturing"), which
voids the capture, or give a graph whose replays differ from the eager step; on the CPU they run silently. Running a
captured body on the CPU under this mode is what catches them without a GPU; ``FakeCapture`` does that for the
step graphs (``StepGraphs(capture=...)``): its capture runs the body once under the mode, its replay runs it again
(under the mode too) and copies the result into the captured output, as a replay rewrites a graph's static output.

What it cannot see: host-to-device copies of CPU tensors made outside the region (every tensor is a CPU tensor
here) and kernels that are capturable on one device only (Triton, the CUDA paged attention): the GPU tests run
those."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

_HOST_READ = "reads a device value on the host (.item(), int(), float(), bool(), an if on a tensor)"
_SHAPE = "a data-dependent shape (the host must read the result's size)"
_RNG = "draws from a generator's state (graphed and eager draws differ; a request's seed does not decide them)"
FORBIDDEN: dict[Any, str] = {
    aten._local_scalar_dense: _HOST_READ,
    aten.is_nonzero: _HOST_READ,
    aten.equal: _HOST_READ,
    aten.allclose: _HOST_READ,
    aten.nonzero: _SHAPE,
    aten.masked_select: _SHAPE,
    aten._unique: _SHAPE,
    aten._unique2: _SHAPE,
    aten.unique_dim: _SHAPE,
    aten.unique_consecutive: _SHAPE,
    aten.bincount: _SHAPE,
    aten.multinomial: _RNG,
    aten.bernoulli: _RNG,
    aten.bernoulli_: _RNG,
    aten.uniform_: _RNG,
    aten.normal_: _RNG,
    aten.exponential_: _RNG,
    aten.rand: _RNG,
    aten.randn: _RNG,
    aten.randint: _RNG,
    aten.randperm: _RNG,
    aten.rand_like: _RNG,
    aten.randn_like: _RNG,
    aten.lift_fresh: "a tensor made from host data (torch.tensor(...): a copy from pageable host memory)",
}


class CaptureBreaker(RuntimeError):
    """An op that a CUDA graph capture refuses (or that makes its replays differ from the eager step)."""


def _bool_index(indices: Any) -> bool:
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


def _why(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    why = FORBIDDEN.get(func.overloadpacket)
    if why is not None:
        return why
    if func.overloadpacket is aten.index and _bool_index(args[1]):
        return "boolean-mask indexing: " + _SHAPE
    if func.overloadpacket in (aten.index_put_, aten.index_put, aten._index_put_impl_):
        if _bool_index(args[1]):
            return "boolean-mask assignment: " + _SHAPE
        if (args[3] if len(args) > 3 else kwargs.get("accumulate", False)) is True:
            # older torch range-checks its indices with .item() here; some versions sort on a path a capture
            # refuses (the reason torch.compile turns CUDA graphs off around it): scatter_add_ is capturable
            return "index_put_(accumulate=True): not capturable on every torch version (use scatter_add_)"
    if func.overloadpacket is aten.repeat_interleave and func is aten.repeat_interleave.Tensor:
        if kwargs.get("output_size") is None:
            return "repeat_interleave by a tensor without output_size: " + _SHAPE
    return None


class _Forbid(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        why = _why(func, args, kwargs)
        if why is not None:
            raise CaptureBreaker(f"{func}: {why}")
        return func(*args, **kwargs)


def _refuse(name: str, why: str) -> Callable[..., Any]:
    def refused(*_: Any, **__: Any) -> Any:
        raise CaptureBreaker(f"{name}: {why}")

    return refused


# host reads that never reach the dispatcher for a CPU tensor (on CUDA each is a device-to-host copy and a sync); under
# ``torch.inference_mode`` (a model's forward) ``.item()``, ``int()`` and ``float()`` of a CPU tensor skip it too
_METHODS = {
    "tolist": _HOST_READ,
    "numpy": _HOST_READ,
    "item": _HOST_READ,
    "__int__": _HOST_READ,
    "__float__": _HOST_READ,
    "__index__": _HOST_READ,
    "cpu": "a device-to-host copy (a sync)",
    "pin_memory": "pinned host memory allocated inside the region",
}


@contextmanager
def forbid_capture_breakers() -> Iterator[None]:
    """Raises ``CaptureBreaker`` at the first op inside the block that a CUDA graph capture would refuse."""
    saved = {name: getattr(torch.Tensor, name) for name in _METHODS}
    from_numpy = torch.from_numpy
    try:
        for name, why in _METHODS.items():
            setattr(torch.Tensor, name, _refuse(f"Tensor.{name}", why))
        torch.from_numpy = _refuse("torch.from_numpy", "a tensor made from host data")  # type: ignore[assignment]
        with _Forbid():
            yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
        torch.from_numpy = from_numpy  # type: ignore[assignment]


class FakeGraph:
    """A captured body on the CPU: ``replay`` runs it again under ``forbid_capture_breakers`` and writes its result
    into the output returned at capture (a real replay rewrites the graph's static output in place)."""

    def __init__(self, body: Callable[[], torch.Tensor], out: torch.Tensor) -> None:
        self.body, self.out = body, out
        self.replays = 0

    def replay(self) -> None:
        with forbid_capture_breakers():
            self.out.copy_(self.body())
        self.replays += 1


class FakeCapture:
    """``StepGraphs``' capture function on the CPU. A CUDA capture records the body without running it: here the body
    runs (under ``forbid_capture_breakers``), so the state it changes (``keep()``'s tensors: the penalty counts, ...)
    is put back after. ``fail``: raise it instead (a capture that breaks)."""

    def __init__(self, keep: Callable[[], list[torch.Tensor]] = list, fail: BaseException | None = None) -> None:
        self.keep, self.fail = keep, fail
        self.graphs: list[FakeGraph] = []

    def __call__(self, body: Callable[[], torch.Tensor]) -> tuple[FakeGraph, torch.Tensor]:
        if self.fail is not None:
            raise self.fail
        kept = [(t, t.clone()) for t in self.keep()]
        with forbid_capture_breakers():
            out = body()
        for t, before in kept:
            t.copy_(before)
        graph = FakeGraph(body, out)
        self.graphs.append(graph)
        return graph, out


def cpu_step_graph_host(monkeypatch: Any) -> None:
    """The step graphs' host side on a CPU: no pinned memory; the CPU attention's and rope's per-step lookups (keyed
    on the step's tensors, which the graphs' static buffers keep) made again at every body run, as on CUDA."""
    from freetoken.layers.rope import Rotary
    from freetoken.runner.step_graph import StepGraphs

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    body, tables = StepGraphs._body, Rotary._tables

    def fresh_body(self: StepGraphs, st: Any, f: Any) -> torch.Tensor:
        st.batch.decode.gathered.clear()
        return body(self, st, f)

    def fresh_tables(self: Rotary, positions: torch.Tensor, dtype: torch.dtype) -> Any:
        self._last = None
        return tables(self, positions, dtype)

    monkeypatch.setattr(StepGraphs, "_body", fresh_body)
    monkeypatch.setattr(Rotary, "_tables", fresh_tables)


def fake_step_graphs(llm: Any, monkeypatch: Any, capture: FakeCapture | None = None, recurrent: bool = False) -> Any:
    """``llm``'s decode steps through step graphs captured by ``capture`` (default: a FakeCapture that puts the
    penalty state back after the capture's run; ``recurrent``: the state slots and KV rows too, which a recurrent
    model's capture run advances from already-advanced states). The backend's layer-graph hooks (CUDA only) off."""
    from freetoken.runner.step_graph import StepGraphs

    eng = llm.engine
    backend = eng.setup.loaded.backend
    monkeypatch.setattr(backend, "step_capturable", lambda tokens, top_k: True)
    for hook in ("begin_step_capture", "end_step_capture", "before_step_replay"):
        monkeypatch.setattr(backend, hook, lambda *a: None)
    state, pools, kv = eng.sampler.state, eng.states, eng.kv

    def kept() -> list[torch.Tensor]:
        extra = [*pools.tensors, *kv.k, *kv.v] if recurrent and pools is not None else []
        return [state.counts, state.seen, *extra]

    rows, pages = eng.config.max_running_requests, eng.kv.pages_for(eng.max_model_len)
    eng.runner.graphs = StepGraphs(eng.setup.loaded.model, eng.kv, backend, eng.sampler, rows, pages, eng.hf.top_k,
                                   capture=capture or FakeCapture(keep=kept))  # fmt: skip
    return llm
