"""The synchronous engine: add requests, step, collect outputs. No HTTP, no threads (see async_llm.py)."""

from __future__ import annotations

import logging
import random
import time
from typing import Any

import torch

from freetoken.cache.kv_pool import KVPool
from freetoken.cache.radix import RadixCache
from freetoken.config import EngineConfig, env
from freetoken.engine.detokenizer import IncrementalDetokenizer
from freetoken.engine.elastic import ElasticMemory
from freetoken.engine.errors import InputError, PromptTooLongError, QueueFullError
from freetoken.engine.grammar import GrammarCompiler
from freetoken.engine.kv_manager import KVManager
from freetoken.engine.layer_major import LayerMajorJob, LayerMajorPlanner
from freetoken.engine.outputs import RequestOutput
from freetoken.engine.overlap import StepOverlap
from freetoken.engine.request import Request, Status
from freetoken.engine.scheduler import Scheduler
from freetoken.engine.scoring import check_token_ids, prompt_logprobs, score
from freetoken.engine.stats import engine_stats
from freetoken.loader.hybrid_build import make_state_pool, state_checkpoints
from freetoken.loader.model_setup import ModelSetup, setup_model
from freetoken.memory.budget import parse_budget_gib
from freetoken.memory.sizes import kv_geometry
from freetoken.runner.constraint import TokenConstraint
from freetoken.runner.runner import ModelRunner
from freetoken.runner.sampling_params import SamplingParams
from freetoken.runner.step_graph import StepGraphs
from freetoken.runner.step_sampler import Choice, StepSampler

log = logging.getLogger(__name__)
RESUME_S = 1.0  # a cache waiting for device memory asks again this often from ``step`` (and at each resize)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        s: ModelSetup = setup_model(config)
        self.setup = s
        self.device, self.dtype, self.hf = s.device, s.dtype, s.hf
        self.tokenizer = s.tokenizer
        self.max_model_len = s.max_model_len
        self.eos_token_ids = s.eos_token_ids
        g = kv_geometry(s.hf)  # GQA heads, or MLA's one latent row per token (V4: each layer's own width)
        self.kv = KVPool(s.loaded.kv_layers, s.kv_pages, config.page_size, g.heads, g.k_dim, s.dtype, s.device, g.v_dim,
                         g.layer_k_dims or None, g.layer_entries or None)  # fmt: skip
        checkpoints = s.plan.state_checkpoints  # every size below comes from the memory plan (``s.plan``)
        self.states = make_state_pool(s.loaded, config.max_running_requests, s.dtype, s.device, checkpoints)
        # a recurrent state resumes only from a checkpoint: without any, no prefix reuse
        self.tree = RadixCache(self.kv) if config.prefix_cache and (self.states is None or checkpoints) else None
        ckpts, anchors = state_checkpoints(
            self.states, self.tree, s, config.state_checkpoint_every, s.plan.host_checkpoints
        )
        self.pages = KVManager(self.kv, self.tree, self.states, ckpts, anchors)
        self.scheduler = Scheduler(self.pages, config.max_running_requests, config.max_batched_tokens)
        self.sampler = StepSampler(config.max_running_requests, s.hf.vocab_size, s.device)
        graphs = None
        if config.cuda_graphs and s.device.type == "cuda" and s.loaded.model.step_capturable:
            max_pages = self.kv.pages_for(self.max_model_len)
            graphs = StepGraphs(
                s.loaded.model, self.kv, s.loaded.backend, self.sampler, config.max_running_requests, max_pages,
                s.hf.top_k,
            )  # fmt: skip
        self.runner = ModelRunner(
            s.loaded.model, self.kv, s.device, s.loaded.backend, s.hf.sliding_window, self.sampler, graphs
        )
        follow = config.vram_budget is not None
        self.memory = ElasticMemory(s.plan, self.scheduler, s.loaded.backend, graphs, s.device, follow)
        tokens = s.plan.activation_tokens
        self.layer_major = LayerMajorPlanner(config, self.pages, self.runner, s.hf, tokens)
        self._job: LayerMajorJob | None = None  # a layer-major prefill in flight (it spans steps)
        overlap = config.overlap_steps if config.overlap_steps is not None else s.device.type == "cuda"
        self.overlap = StepOverlap(self, overlap)  # decode step N+1 launched before step N is read
        self._deliver = False
        self.requests: dict[str, Request] = {}
        self.grammars = GrammarCompiler(s.tokenizer, s.hf.vocab_size, s.eos_token_ids)
        self._seeds = random.Random(config.seed)
        self.counters = {"prefill_tokens": 0, "decode_tokens": 0, "steps": 0, "requests_finished": 0}
        self._pending: list[RequestOutput] = []
        self._resumed_at = 0.0  # the last time a cache waiting for device memory asked again (``step``)
        self.started_at = time.monotonic()
        self.weights_check = s.loaded.weights_check  # an FTW checkpoint's checksums: checked now that serving starts
        if self.weights_check is not None and config.verify_weights == "background":
            self.weights_check.start()

    # ---- elastic memory (safe points only: between steps, on the engine thread) ---------------------------
    @property
    def layer_major_busy(self) -> bool:
        """A layer-major prefill is in flight (it spans steps; its batches name KV slots)."""
        return self._job is not None

    def can_resize(self) -> bool:
        """A safe point for elastic memory: between steps, and no layer-major prefill in flight (its batches
        name KV slots and it streams layers through the slot pool across steps)."""
        return self._job is None

    def _quiet(self) -> None:
        """Reads the overlapped step in flight (its outputs come with the next ``step``): the caches are
        changed or read outside the step next."""
        drained = self.overlap.drain()
        self._pending += drained
        self._deliver = self._deliver or bool(drained)  # ``has_unfinished`` until a ``step`` returns them

    def set_vram_budget(self, budget_gib: object, reason: str = "set by hand") -> dict[str, Any]:
        """Resizes the expert slots and KV pages to a new budget (GiB); ``BudgetError`` (nothing changes) below
        the minimum. Returns the memory split (``stats()["memory"]``). Only where ``can_resize()``."""
        budget = parse_budget_gib(budget_gib)
        if not self.can_resize():
            raise RuntimeError("a layer-major prefill is in flight: resize after it (AsyncLLM waits for it)")
        self._quiet()
        self.memory.set_budget(budget, reason)
        return self.memory.stats()

    def retry_memory(self) -> None:
        """Caches waiting for memory, or not put back after a failed resize, ask again every ``RESUME_S``."""
        now = time.monotonic()
        m = self.memory
        if (m.waiting or m.restore_to is not None) and now - self._resumed_at >= RESUME_S:
            self._resumed_at = now
            if self.can_resize() and self.overlap.inflight is None:
                m.retry()
            else:
                m.resume()

    def observe_free_memory(self, free_bytes: int) -> None:
        """The VRAM watcher's reading: shrink or grow at this safe point when the policy says so (a reading
        during a layer-major prefill is dropped: the watcher reads again)."""
        if self.can_resize():
            self._quiet()
            self.memory.on_free_memory(free_bytes)

    # ---- requests -------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        constraint: TokenConstraint | None = None,
    ) -> None:
        """``constraint``: ``params.grammar`` compiled already (``AsyncLLM`` compiles off the engine thread);
        None compiles it here."""
        if request_id in self.requests:
            raise InputError(f"duplicate request id {request_id!r}")
        if not prompt_token_ids:
            raise InputError("the prompt is empty")
        check_token_ids(prompt_token_ids, self.hf.vocab_size)
        n = len(prompt_token_ids)
        if n >= self.max_model_len:
            raise PromptTooLongError(n, self.max_model_len)
        if self.kv.pages_for(n + 1) > self.scheduler.most_pages:
            raise InputError(f"prompt of {n} tokens can never fit the KV pool "
                             f"({self.scheduler.most_pages * self.kv.page_size} tokens)")  # fmt: skip
        if len(self.scheduler.waiting) >= self.config.max_queued_requests:
            raise QueueFullError(f"the queue is full ({self.config.max_queued_requests} requests waiting)")
        if constraint is None and params.grammar is not None:
            constraint = self.grammars.compile(params.grammar)
        seed = params.seed if params.seed is not None else self._seeds.getrandbits(63)
        req = Request(
            request_id=request_id,
            prompt_token_ids=[int(t) for t in prompt_token_ids],
            params=params,
            max_total_tokens=min(n + params.max_tokens, self.max_model_len),
            detok=IncrementalDetokenizer(
                self.tokenizer, prompt_token_ids, params.stop_strings, params.skip_special_tokens
            ),
            seed=seed,
            constraint=constraint,
        )
        self.requests[request_id] = req
        self.scheduler.add(req)

    def abort(self, request_id: str) -> None:
        req = self.requests.get(request_id)
        if req is not None and not req.finished:
            self._finish(req, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work() or self.overlap.inflight is not None or self._deliver

    # ---- the step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduled step. A failure while computing or sampling one request finishes that request
        with an error (finish_reason "error"); the others carry on. Only a failure outside any one
        request (the scheduler, the caches) propagates. A prefill spanning several chunks may run layer-major
        over several steps (``layer_major.py``): each step then runs the other requests' decode first. A decode
        step may be launched before the previous one is read (``overlap.py``): each call reads one step."""
        outputs, self._pending, self._deliver = self._pending, [], False
        if self.overlap.inflight is None:
            outputs += self._schedule_and_run()
        if self.overlap.inflight is not None:
            outputs += self.overlap.advance()
        outputs += self._pending
        self._pending = []
        if self.can_resize() and self.overlap.inflight is None:
            self.memory.follow()  # a safe point: the split may follow the session's KV
        if env().debug:  # FREETOKEN_DEBUG: every invariant checked after each step
            self.check_integrity()
        return outputs

    def _schedule_and_run(self) -> list[RequestOutput]:
        """A serial boundary: schedule, then compute the batch, or launch it (``overlap.py``: ``step`` reads it)."""
        outputs: list[RequestOutput] = []
        self.retry_memory()
        if self.memory.waiting:  # a cache without device memory (``ElasticMemory.waiting``): no step can run
            time.sleep(0.01)  # the requests wait in place; the watcher's next grow asks again too
            return outputs
        batch = self.scheduler.schedule(admit=self._job is None)
        for req in batch.never_fit:
            self._finish(req, "error", error="the request does not fit the KV pool even alone")
        items = batch.items
        if self._job is None and items:
            self._job, items = self.layer_major.plan(items)
        if items and self.overlap.can_start(items):
            if self.overlap.start(items):
                items = []  # read by ``step``
            else:
                outputs += self._commit(*self._compute(items, batched=False))
                items = []
        if items:
            outputs += self._commit(*self._compute(items))
        if self._job is not None:
            outputs += self._advance_job(self._job)
        return outputs

    def _commit(self, items: list[tuple[Request, int]], sampled: list[tuple[Request, Choice]]) -> list[RequestOutput]:
        """A computed step's bookkeeping, then its tokens appended."""
        if items:
            self.counters["steps"] += 1
        for req, n in items:
            was_prefill = req.num_computed_tokens < req.num_prompt_tokens
            req.num_computed_tokens += n
            self.pages.roll(req)
            self.counters["prefill_tokens" if was_prefill else "decode_tokens"] += n
        return self.append_all(sampled)

    def append_all(self, sampled: list[tuple[Request, Choice]]) -> list[RequestOutput]:
        outputs = []
        for req, choice in sampled:
            try:
                outputs.append(self._append_token(req, choice))
            except Exception as exc:
                self._fail(req, "sampling failed", exc)
        return outputs

    def _advance_job(self, job: LayerMajorJob) -> list[RequestOutput]:
        """Runs the layer-major prefill on: within the interleave budget while other requests run (their
        next decode step comes at the next ``step``), else to its end."""
        others = any(not r.busy for r in self.scheduler.running)
        try:
            job.advance(self.config.prefill_interleave_ms / 1e3 if others else None)
            if not job.done:
                return []
            self._job = None
            sampled = job.finish()
        except Exception as exc:
            self._job = None
            job.cancel()
            for req in job.requests:
                self._fail(req, "the layer-major prefill failed", exc)
            return []
        self.counters["steps"] += 1
        self.counters["prefill_tokens"] += job.tokens
        return self.append_all(sampled)

    def _compute(
        self, items: list[tuple[Request, int]], batched: bool = True
    ) -> tuple[list[tuple[Request, int]], list[tuple[Request, Choice]]]:
        """Runs and samples the batch; if that fails (or not ``batched``: a launch of it failed), runs each
        request alone (eagerly) so that only the requests that fail alone are finished with an error. Returns
        the items computed and the choices."""
        try:
            if batched:
                return items, self.runner.step(items)
        except Exception as exc:
            if len(items) == 1:
                self._fail(items[0][0], "the model step failed", exc)
                return [], []
            log.warning(
                "a batched step failed (%s: %s); running its %d requests one by one",
                type(exc).__name__,
                exc,
                len(items),
            )
        done: list[tuple[Request, int]] = []
        sampled: list[tuple[Request, Choice]] = []
        for item in items:
            try:
                sampled += self._step_alone(*item)
            except Exception as exc:
                self._fail(item[0], "the model step failed", exc)
                continue
            done.append(item)
        return done, sampled

    def _step_alone(self, req: Request, n: int) -> list[tuple[Request, Choice]]:
        """One request's step, eagerly. With linear-attention layers the failed batched step may have advanced its
        recurrent state already: it is recomputed from position 0 (its KV pages cover that already)."""
        done = req.num_computed_tokens
        if self.states is None or done == 0:
            return self.runner.step([(req, n)], graphs=False)
        req.num_computed_tokens = 0
        try:
            return self.runner.step([(req, done + n)], graphs=False)
        finally:
            req.num_computed_tokens = done

    def _fail(self, req: Request, what: str, exc: BaseException) -> None:
        log.error("request %s: %s: %s: %s", req.request_id, what, type(exc).__name__, exc)
        self._finish(req, "error", error=f"{what}: {type(exc).__name__}: {exc}")

    def fail_all(self, error: str) -> None:
        """Finishes every request with ``error`` (server shutdown, or recovery after a failed step);
        their last outputs wait in ``take_pending()``."""
        self.overlap.inflight = None  # every row is discarded (after a failed step it may not be readable)
        for req in list(self.requests.values()):
            self._finish(req, "error", error=error)

    def take_pending(self) -> list[RequestOutput]:
        """Outputs of requests finished between steps (aborts emit none)."""
        out, self._pending = self._pending, []
        return out

    def _append_token(self, req: Request, choice: Choice) -> RequestOutput:
        token = choice.token
        c = req.constraint
        if c is not None and not c.accept(token):
            raise ValueError(f"the grammar refused token {token}: {c.error() or 'no token was allowed'}")
        req.token_ids.append(token)
        p = req.params
        stop_token = (token in self.eos_token_ids and not p.ignore_eos) or token in p.stop_token_ids
        text, stop_str = ("", False) if stop_token else req.detok.add_token(token)
        reason = None
        if stop_token or stop_str or (req.constraint is not None and req.constraint.is_done()):
            reason = "stop"  # a finished grammar allows nothing but the end
        elif req.num_output_tokens >= p.max_tokens or req.num_tokens >= req.max_total_tokens:
            reason = "length"
        if reason is not None:
            text += req.detok.flush()
            self._finish(req, reason, emit=False)
        out = self._output(req, [token], text)
        if choice.logprob is not None:
            out.logprobs = [(token, choice.logprob, choice.top or [])]
        return out

    def _output(self, req: Request, new_ids: list[int], text: str, error: str | None = None) -> RequestOutput:
        return RequestOutput(
            request_id=req.request_id,
            new_token_ids=new_ids,
            new_text=text,
            finished=req.finished,
            finish_reason=req.finish_reason,
            prompt_tokens=req.num_prompt_tokens,
            completion_tokens=req.num_output_tokens,
            error=error,
            cached_tokens=req.num_cached_tokens,
        )

    def _finish(self, req: Request, reason: str, emit: bool = True, error: str | None = None) -> None:
        if req.busy and self._job is not None:  # its pages are about to go: the job cannot carry on
            self._job.cancel()
            self._job = None
        self.scheduler.finish(req)
        self.sampler.release(req)
        req.status = Status.FINISHED
        req.finish_reason = reason
        self.requests.pop(req.request_id, None)
        self.counters["requests_finished"] += 1
        if emit:
            # an aborted or failed request says nothing more (a failed detokenizer may fail again)
            text = req.detok.flush() if reason not in ("abort", "error") else ""
            self._pending.append(self._output(req, [], text, error))

    def score(
        self, token_ids: list[int], chunk: int | list[int] | None = None, layer_major: bool = False
    ) -> torch.Tensor:
        """Logits [n, V] at every position of ``token_ids`` by prefill in chunks (``scoring.score``)."""
        self._quiet()
        return score(self.runner, self.pages, self.states, self.max_model_len, token_ids, chunk, layer_major)

    def prompt_logprobs(self, token_ids: list[int], top: int = 0) -> list[tuple[float, list[tuple[int, float]]]]:
        """Per token after the first: its logprob under the tokens before it and the ``top`` best alternatives."""
        check_token_ids(token_ids, self.hf.vocab_size)
        return prompt_logprobs(self.score(token_ids), token_ids, top) if len(token_ids) > 1 else []

    # ---- introspection --------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return engine_stats(self)

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()
        backend = self.setup.loaded.backend
        if backend is not None:
            backend.check_integrity()
