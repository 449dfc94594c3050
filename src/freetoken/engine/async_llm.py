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
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from freetoken.config import EngineConfig
from freetoken.engine.engine import LLMEngine
from freetoken.engine.errors import EngineDeadError
from freetoken.engine.outputs import RequestOutput
from freetoken.engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)
DEFAULT_MODEL_NAME = "freetoken-default"


class AsyncLLM:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.state = "loading"  # loading | ready | dead | stopped
        self.error: str | None = None
        self.engine: LLMEngine | None = None
        self._cmds: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[RequestOutput | BaseException]]] = {}
        self._ready = threading.Event()
        self._stop = False
        self._drain = True
        self._stats: dict[str, Any] = {}
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._main, name="freetoken-engine", daemon=True)

    @classmethod
    def start(cls, config: EngineConfig) -> AsyncLLM:
        self = cls(config)
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
    def eos_token_ids(self) -> list[int]:
        return list(self._eng().eos_token_ids)

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
        q: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        added: cf.Future[None] = cf.Future()
        self._streams[rid] = (loop, q)
        self._cmds.put(("add", rid, list(prompt_token_ids), params, added))
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
                self._cmds.put(("abort", rid))

    def stats(self) -> dict[str, Any]:
        return {**self._stats, "state": self.state}

    def check_integrity(self) -> None:
        done: cf.Future[None] = cf.Future()
        self._cmds.put(("check", done))
        done.result(timeout=30)

    async def check_integrity_async(self) -> None:
        done: cf.Future[None] = cf.Future()
        self._cmds.put(("check", done))
        await asyncio.wrap_future(done)

    async def shutdown(self, drain: bool = True) -> None:
        self._drain = drain
        self._stop = True
        self._cmds.put(("wake",))
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 60)

    # ---- the engine thread ----------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self.engine = LLMEngine(self.config)
            self._stats = self.engine.stats()
            self.state = "ready"
        except BaseException as e:  # loading failed: report, never hang
            self.state, self.error = "dead", f"{type(e).__name__}: {e}"
            log.error("engine failed to load: %s", self.error)
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop(self.engine)
        except BaseException as e:
            self.state, self.error = "dead", f"{type(e).__name__}: {e}"
            log.exception("engine thread died")
            self._fail_all(EngineDeadError(self.error))

    def _loop(self, eng: LLMEngine) -> None:
        while True:
            if self._stop and (not self._drain or not eng.has_unfinished()):
                for rid in list(eng.requests):
                    eng.abort(rid)
                self._dispatch(eng.step() if eng.has_unfinished() else [])
                self.state = "stopped"
                self._fail_all(EngineDeadError("the server is shutting down"))
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
                outputs = eng.step()
                self._stats = eng.stats()  # before dispatch: a finished stream sees its pages freed
                self._dispatch(outputs)

    def _handle(self, eng: LLMEngine, cmd: tuple[Any, ...]) -> None:
        kind = cmd[0]
        if kind == "add":
            _, rid, ids, params, fut = cmd
            try:
                eng.add_request(rid, ids, params)
                fut.set_result(None)
            except Exception as e:
                fut.set_exception(e)
        elif kind == "abort":
            eng.abort(cmd[1])
        elif kind == "check":
            try:
                eng.check_integrity()
                cmd[1].set_result(None)
            except BaseException as e:
                cmd[1].set_exception(e)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                loop, q = stream
                loop.call_soon_threadsafe(q.put_nowait, out)

    def _fail_all(self, err: BaseException) -> None:
        for loop, q in list(self._streams.values()):
            loop.call_soon_threadsafe(q.put_nowait, err)
