"""The engine on its own thread, driven from asyncio: what the HTTP frontend talks to.

The engine thread owns the model and the GPU streams; the frontend sends commands through a
thread-safe queue (processed between steps, a safe point) and receives per-request outputs on
asyncio queues. No HTTP here: this runs wherever torch runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from freetoken.config import EngineConfig
from freetoken.engine.commands import Abort, Add, Check, Command, FailAll, FreeMemory, Score, SetMemory, Wake
from freetoken.engine.engine import LLMEngine
from freetoken.engine.errors import EngineDeadError, RequestFailedError, ShuttingDownError
from freetoken.engine.outputs import RequestOutput
from freetoken.engine.vram_watch import FreeMemorySource, NvmlSource, VramWatcher, watch_decision
from freetoken.runner.sampling_params import SamplingParams

log = logging.getLogger(__name__)
DEFAULT_MODEL_NAME = "freetoken-default"


class AsyncLLM:
    def __init__(self, config: EngineConfig, free_memory: FreeMemorySource | None = None) -> None:
        """``free_memory``: what the VRAM watcher reads (tests pass a fake one, on any device); None: NVML on
        CUDA when ``vram_watch`` is on."""
        self.config = config
        self._free_memory = free_memory
        self.state = "loading"  # loading | ready | dead | stopped
        self.error: str | None = None
        self.load_failure: BaseException | None = None  # why loading failed (``error`` says it in words)
        self.engine: LLMEngine | None = None
        self._cmds: queue.Queue[Command] = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[RequestOutput | BaseException]]] = {}
        self._ready = threading.Event()
        self._stop = False
        self._drain = True
        self._stats: dict[str, Any] = {}
        self._fault: str | None = None  # why the engine cannot run a step, as of its last safe point
        self._ids = itertools.count()
        self.watcher: VramWatcher | None = None
        self._deferred: list[SetMemory | Score] = []  # wait for a safe point (a layer-major prefill runs)
        self._thread = threading.Thread(target=self._main, name="freetoken-engine", daemon=True)

    @classmethod
    def start(cls, config: EngineConfig, free_memory: FreeMemorySource | None = None) -> AsyncLLM:
        self = cls(config, free_memory)
        self._thread.start()
        return self

    # ---- model facts (valid once ready) ---------------------------------------------------------
    def _eng(self) -> LLMEngine:
        if self.engine is None:
            raise EngineDeadError(self.error or "the engine is not ready")
        return self.engine

    @property
    def tokenizer(self) -> Any:
        return self._eng().tokenizer

    @property
    def chat_template(self) -> str | None:
        tok = self._eng().tokenizer
        return getattr(tok, "chat_template", None) if tok is not None else None

    @property
    def model_name(self) -> str:
        return Path(self.config.model).name if self.config.model else DEFAULT_MODEL_NAME

    @property
    def model_type(self) -> str:
        return self._eng().hf.model_type

    @property
    def max_model_len(self) -> int:
        return self._eng().max_model_len

    @property
    def vocab_size(self) -> int:
        return int(self._eng().hf.vocab_size)

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self._eng().eos_token_ids)

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Blocks until loading ended (``state`` is then ready or dead); False on timeout."""
        return self._ready.wait(timeout)

    async def wait_ready(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._ready.wait)
        if self.state != "ready":
            raise EngineDeadError(self.error or f"engine {self.state}")

    # ---- requests -------------------------------------------------------------------------------
    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        if self.state != "ready":
            raise EngineDeadError(self.error or f"the engine is {self.state}")
        rid = request_id or f"req-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        constraint = None
        if params.grammar is not None:  # InputError (a bad grammar) surfaces here, before any output
            constraint = await loop.run_in_executor(None, self._eng().grammars.compile, params.grammar)
        q: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        added: cf.Future[None] = cf.Future()
        self._streams[rid] = (loop, q)
        self._cmds.put(Add(rid, list(prompt_token_ids), params, added, constraint))
        finished = False
        try:
            await asyncio.wrap_future(added)  # InputError / QueueFullError surface here, before any output
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished and self.state == "ready":
                self._cmds.put(Abort(rid))

    def stats(self) -> dict[str, Any]:
        """The engine's counters as of its last safe point (refreshed after every step and command,
        and every half second while idle), with the uptime as of now."""
        stats = {**self._stats, "state": self.state, "vram_watcher": "on" if self.watcher is not None else "off"}
        if self.engine is not None:
            stats["uptime_s"] = time.monotonic() - self.engine.started_at
        return stats

    def memory_plan(self) -> dict[str, Any] | None:
        """The memory plan as it stands (the start's, with the sizes of the last resize); None before the engine is
        built. The plan is immutable and replaced whole at a resize: read here, from any thread."""
        return None if self.engine is None else self.engine.memory.plan.as_dict()

    def health(self) -> str | None:
        """Why this engine cannot generate now, None when it can: not ready, its thread gone, or its caches unable
        to serve a step (waiting for device memory, a pool without its layers) as of its last safe point."""
        if self.state != "ready":
            return self.error or f"the engine is {self.state}"
        if not self._thread.is_alive():
            return "the engine thread is gone"
        return self._fault

    def check_integrity(self) -> None:
        done: cf.Future[None] = cf.Future()
        self._cmds.put(Check(done))
        done.result(timeout=30)

    async def check_integrity_async(self) -> None:
        done: cf.Future[None] = cf.Future()
        self._cmds.put(Check(done))
        await asyncio.wrap_future(done)

    async def set_vram_budget(self, budget_gib: object, reason: str = "set by hand") -> dict[str, Any]:
        """Resizes the engine to a VRAM budget (GiB) at its next safe point; returns the new memory split, or
        raises ``BudgetError`` (with the numbers) and changes nothing."""
        if self.state != "ready":
            raise EngineDeadError(self.error or f"the engine is {self.state}")
        done: cf.Future[dict[str, Any]] = cf.Future()
        self._cmds.put(SetMemory(budget_gib, reason, done))  # type: ignore[arg-type]  # checked on the thread
        return await asyncio.wrap_future(done)

    async def prompt_logprobs(self, token_ids: list[int], top: int = 0) -> list[tuple[float, list[tuple[int, float]]]]:
        """Per token after the first: (its logprob given the tokens before it, the ``top`` best alternatives), by a
        prefill of the prompt on the engine thread at its next safe point (temporary pages: no request is touched)."""
        if self.state != "ready":
            raise EngineDeadError(self.error or f"the engine is {self.state}")
        done: cf.Future[list[tuple[float, list[tuple[int, float]]]]] = cf.Future()
        self._cmds.put(Score(list(token_ids), top, done))
        return await asyncio.wrap_future(done)

    def fail_all(self, error: Exception) -> None:
        """Finish every request now; each stream raises ``error``. New requests still run."""
        self._cmds.put(FailAll(error))

    async def shutdown(self, drain: bool = True) -> None:
        self._drain = drain
        self._stop = True
        self._cmds.put(Wake())
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 60)

    # ---- the engine thread ----------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self.engine = LLMEngine(self.config)
            self._stats = self.engine.stats()
            self.state = "ready"
        except BaseException as e:  # loading failed: report, never hang (the caller says it, /health too)
            self.state, self.error, self.load_failure = "dead", f"{type(e).__name__}: {e}", e
            log.debug("engine failed to load: %s", self.error)
            self._ready.set()
            return
        self.watcher = self._start_watcher(self.engine)  # before ready: callers may look at it at once
        self._ready.set()
        try:
            self._loop(self.engine)
        except BaseException as e:
            self.state, self.error = "dead", f"{type(e).__name__}: {e}"
            log.exception("engine thread died")
            self._fail_all(EngineDeadError(self.error))
        finally:
            if self.watcher is not None:
                self.watcher.stop()

    def _start_watcher(self, eng: LLMEngine) -> VramWatcher | None:
        """The VRAM watcher on CUDA (``vram_watch``), when NVML sees the device (or on the source given)."""
        source = self._free_memory
        if source is None:
            if not self.config.vram_watch or eng.device.type != "cuda":
                return None
            source = NvmlSource.open(eng.device)
        if source is None:
            return None
        mem = eng.memory

        def wants(free: int) -> bool:  # the watcher's thread reads the engine's ints: a stale one only delays
            f = mem.facts
            return watch_decision(free, f.reserve_bytes, mem.split.budget_bytes, mem.target_bytes,
                                  f.minimum_budget) is not None  # fmt: skip

        return VramWatcher(source, wants, lambda free: self._cmds.put(FreeMemory(free))).start()

    def _loop(self, eng: LLMEngine) -> None:
        while True:
            if self._stop and (not self._drain or not eng.has_unfinished()):
                for rid in list(eng.requests):
                    eng.abort(rid)
                self._dispatch(eng.step() if eng.has_unfinished() else [])
                self.state = "stopped"
                self._fail_all(ShuttingDownError("the server is shutting down"))
                for c in self._deferred:
                    if c.done.set_running_or_notify_cancel():
                        c.done.set_exception(ShuttingDownError("the server is shutting down"))
                return
            block = not eng.has_unfinished() and not self._stop
            try:
                cmd = self._cmds.get(block=block, timeout=0.5 if block else None)
                self._handle(eng, cmd)
                while True:
                    self._handle(eng, self._cmds.get_nowait())
            except queue.Empty:
                pass
            if eng.has_unfinished():
                try:
                    outputs = eng.step()
                except Exception as exc:  # not one request's fault: fail them all, keep serving if sound
                    outputs = self._recover(eng, exc)
                # before dispatch: a finished stream sees its pages freed
                self._stats, self._fault = eng.stats(), eng.memory.fault()
                self._dispatch(outputs)
                if self._deferred and eng.can_resize():
                    waiting, self._deferred = self._deferred, []
                    for c in waiting:
                        self._handle(eng, c)
            else:
                eng.retry_memory()  # no request asks for a step: a cache waiting for device memory asks on its own
                self._stats, self._fault = eng.stats(), eng.memory.fault()  # after aborts, and while idle

    def _recover(self, eng: LLMEngine, exc: Exception) -> list[RequestOutput]:
        """A step failed outside any one request: every request fails with the error (outputs the step
        had made are lost with it, so each stream hears of the failure instead); the engine serves on
        only if its caches are still sound, else the thread dies and /health says why."""
        log.exception("engine step failed; failing its %d requests", len(eng.requests))
        error = f"the engine step failed: {type(exc).__name__}: {exc}"
        eng.fail_all(error)
        eng.take_pending()
        self._fail_all(RequestFailedError(error))
        eng.check_integrity()
        return []

    def _handle(self, eng: LLMEngine, cmd: Command) -> None:
        """One command. Nothing a command does may end the engine thread: a failure is logged and
        reported to the command's future where it has one."""
        try:
            self._run_command(eng, cmd)
        except Exception:
            log.exception("engine command %s failed", type(cmd).__name__)

    def _run_command(self, eng: LLMEngine, cmd: Command) -> None:
        if isinstance(cmd, Add):
            if not cmd.accepted.set_running_or_notify_cancel():
                return  # the client gave up before the engine saw its request
            try:
                eng.add_request(cmd.request_id, cmd.prompt_token_ids, cmd.params, cmd.constraint)
            except Exception as e:
                cmd.accepted.set_exception(e)
            else:
                cmd.accepted.set_result(None)
        elif isinstance(cmd, Abort):
            eng.abort(cmd.request_id)
        elif isinstance(cmd, FailAll):
            eng.fail_all(str(cmd.error))
            eng.take_pending()  # the streams raise the error instead
            self._fail_all(cmd.error)
        elif isinstance(cmd, Score):
            if not eng.can_resize():
                self._deferred.append(cmd)  # a layer-major prefill owns the caches until its step ends
                return
            if not cmd.done.set_running_or_notify_cancel():
                return
            try:
                cmd.done.set_result(eng.prompt_logprobs(cmd.token_ids, cmd.top))
            except Exception as e:
                cmd.done.set_exception(e)
        elif isinstance(cmd, SetMemory):
            if not eng.can_resize():
                self._deferred.append(cmd)  # run after the step that ends the layer-major prefill
                return
            if not cmd.done.set_running_or_notify_cancel():
                return
            try:
                split = eng.set_vram_budget(cmd.budget_gib, cmd.reason)
            except Exception as e:
                cmd.done.set_exception(e)
            else:
                cmd.done.set_result(split)
        elif isinstance(cmd, FreeMemory):
            try:
                eng.observe_free_memory(cmd.free_bytes)
            finally:
                if self.watcher is not None:
                    self.watcher.done()
        elif isinstance(cmd, Check):
            if not cmd.done.set_running_or_notify_cancel():
                return
            try:
                eng.check_integrity()
            except BaseException as e:
                cmd.done.set_exception(e)
            else:
                cmd.done.set_result(None)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                loop, q = stream
                loop.call_soon_threadsafe(q.put_nowait, out)

    def _fail_all(self, err: BaseException) -> None:
        for loop, q in list(self._streams.values()):
            loop.call_soon_threadsafe(q.put_nowait, err)
