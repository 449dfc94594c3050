"""Overlapped decode steps (vLLM's async scheduling, SGLang's overlap scheduler): while the device runs step N,
the host launches step N+1 and only then reads and processes step N's tokens.

A decode batch is launched (``ModelRunner.launch``) instead of computed; at each engine step, before the host
reads the step in flight, the next one is launched behind it when nothing it needs comes from the host's view of
the step in flight (``_chain``): the same rows, each one token further on (position, KV slot, context length and
the sampler's step counter + 1, seeds as they are), its input ids gathered on the device from the in-flight
step's samples. Then the host waits for the in-flight step's event alone, commits its rows (computed tokens,
the rolling checkpoint) and appends their tokens (detokenize, stop strings, finish). A row whose request finished
meanwhile (EOS, a stop token or string, an abort, an error) is discarded when its step is read: its token is
never appended, streamed or counted.

What a discarded row computed never becomes visible: its K/V at the position after the request's last committed
token lies past every whole page the prefix cache takes (``KVManager.release`` caches only
``num_computed_tokens // page_size`` pages, and ``num_computed_tokens`` counts committed tokens only); its
recurrent state slot (linear-attention layers) and its penalty row are given back with the request, and their
next owner starts them over in stream order (a slot from zeros or a restored checkpoint, a penalty row with
``PenaltyState.reset``). A request that survives is never stepped twice: a launched row is always committed or
its request is finished.

The next step is launched ahead only for a batch of the same running requests, each decoding one token, with no
grammar-constrained row (its bitmask needs the token), no state checkpoint due (its copy follows a serial step, whose
row is never discarded), no request waiting for room to join, no layer-major prefill in flight, no memory resize wanted,
a backend whose per-step host work may run ahead (``ExpertBackend.runs_ahead``) and KV pages for the extra position
allocated first. A request known to finish at the step in flight (its length limit) is left out of the next launch.
Otherwise the in-flight step is read alone, and the engine's next step is a serial boundary: scheduling (requests join,
prefill chunks, preemption) happens only there. A launch ahead that fails turns overlap off; its rows are computed again
by serial steps (with recurrent states, which the failure may have advanced part of the way, each of its requests is
preempted once the step in flight is read: recomputed from its cached prefix and checkpoint).
"""

from __future__ import annotations

import logging
from typing import Protocol

from freetoken.cache.anchors import due_captures
from freetoken.cache.state_pool import StatePool
from freetoken.engine.elastic import ElasticMemory
from freetoken.engine.kv_manager import KVManager
from freetoken.engine.outputs import RequestOutput
from freetoken.engine.request import Request
from freetoken.engine.scheduler import Scheduler
from freetoken.runner.inflight import Launch
from freetoken.runner.runner import ModelRunner
from freetoken.runner.step_sampler import Choice


class OverlapHost(Protocol):
    """What the overlap reads and calls of the engine (``LLMEngine``)."""

    runner: ModelRunner
    scheduler: Scheduler
    pages: KVManager
    memory: ElasticMemory
    states: StatePool | None
    counters: dict[str, int]

    @property
    def layer_major_busy(self) -> bool: ...

    def append_all(self, sampled: list[tuple[Request, Choice]]) -> list[RequestOutput]: ...


log = logging.getLogger(__name__)


class StepOverlap:
    def __init__(self, engine: OverlapHost, enabled: bool) -> None:
        self.engine = engine
        self.enabled = enabled
        self.inflight: Launch[Request] | None = None  # the step launched and not read yet
        self.launched_ahead = 0  # steps launched before the previous one was read

    def can_start(self, items: list[tuple[Request, int]]) -> bool:
        """Whether the scheduled batch runs as a launched step (read at the end of this engine step, after the
        next one may have been launched behind it): every running request decoding one token (a prompt's
        one-token chunk that its prompt goes on after, under a tiny token budget, is not: it samples nothing)."""
        e = self.engine
        if not self.enabled or e.layer_major_busy or not e.runner.can_run_ahead():
            return False
        decode = all(n == 1 and req.num_computed_tokens + 1 >= req.num_tokens for req, n in items)
        return decode and len(items) == len(e.scheduler.running)

    def start(self, items: list[tuple[Request, int]]) -> bool:
        """Launches the scheduled batch; False (nothing launched) when that failed: the caller computes it."""
        try:
            self.inflight = self.engine.runner.launch(items)
        except Exception as exc:  # noqa: BLE001 - the serial path retries request by request
            log.warning("launching a decode step failed (%s: %s); computing it serially", type(exc).__name__, exc)
            return False
        return True

    def advance(self) -> list[RequestOutput]:
        """Launches the next step behind the one in flight when it can, then reads the one in flight."""
        step, self.inflight = self.inflight, None
        assert step is not None
        self.inflight, failed = self._chain(step)
        outputs = self._read(step)
        if failed and self.engine.states is not None:
            # the failed launch may have advanced their recurrent states part of the way: they are recomputed from
            # their cached prefix and checkpoint (their own slots only were touched), as after a preemption
            for req in failed:
                if not req.finished:
                    self.engine.scheduler.preempt(req)
        return outputs

    def drain(self) -> list[RequestOutput]:
        """Reads the step in flight, if any (before anything that needs the caches quiet: a resize, scoring)."""
        if self.inflight is None:
            return []
        step, self.inflight = self.inflight, None
        return self._read(step)

    def _chain(self, step: Launch[Request]) -> tuple[Launch[Request] | None, list[Request]]:
        """The next step launched behind ``step`` (None where it cannot be), and the requests of a launch that
        failed (their next steps are serial ones, from then on every step is)."""
        e = self.engine
        if e.scheduler.waiting and len(e.scheduler.running) < e.scheduler.max_running:
            return None, []  # a request may join: a serial boundary
        if e.layer_major_busy or e.memory.waiting or e.memory.wants_follow():
            return None, []
        rows: list[int] = []
        for i, (req, _) in enumerate(step.items):
            if req.finished or _finishes_by_length(req):
                continue
            if req.constraint is not None:
                return None, []  # its bitmask needs the token in flight
            rows.append(i)
        if not rows:
            return None, []
        items = [(step.items[i][0], 1) for i in rows]
        starts = [step.starts[i] + 1 for i in rows]
        if due_captures(items, starts):
            # a state checkpoint: its copy is taken behind a serial step, whose row is committed (a row launched
            # ahead may be discarded, and its state must not reach the checkpoint)
            return None, []
        if not all(e.pages.grow(req, 2) for req, _ in items):  # the page for the position after (no preemption)
            return None, []
        try:
            nxt = e.runner.launch(items, starts, step, rows)
        except Exception as exc:  # noqa: BLE001 - its rows are computed again by serial steps
            log.warning("launching a decode step ahead failed (%s: %s); serial steps from now on",
                        type(exc).__name__, exc)  # fmt: skip
            self.enabled = False
            return None, [req for req, _ in items]
        self.launched_ahead += 1
        return nxt, []

    def _read(self, step: Launch[Request]) -> list[RequestOutput]:
        """Waits for ``step``, commits its surviving rows and appends their tokens."""
        e = self.engine
        picked = step.read()
        sampled: list[tuple[Request, Choice]] = []
        for (req, n), start, choice in zip(step.items, step.starts, picked, strict=True):
            if req.finished:
                continue  # finished after this row was launched: discarded
            assert req.num_computed_tokens == start, "an overlapped row is out of step with its request"
            req.num_computed_tokens += n
            e.pages.roll(req)
            e.counters["decode_tokens"] += n
            sampled.append((req, choice))
        e.counters["steps"] += bool(sampled)  # a step whose rows were all discarded computed nothing of use
        return e.append_all(sampled)


def _finishes_by_length(req: Request) -> bool:
    """Whether the token in flight is the request's last by its length limits (its next row would be waste)."""
    return req.num_output_tokens + 1 >= req.params.max_tokens or req.num_tokens + 1 >= req.max_total_tokens
