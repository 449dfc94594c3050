"""The serving core shared by every protocol: prompt → engine → parsed events.

``Generation.prepare`` renders the internal request with the model's chat template (special-token
strings inside message text stay plain text), checks the context and clamps ``max_tokens``.
``Generation.stream`` drives the engine and the family's stream parser and yields the parser's
events followed by one ``Finish``. Closing the stream early (client gone) closes the engine
iterator, which aborts the request and frees its KV pages.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from freetoken.chat import events as ev
from freetoken.chat import make_stream_parser, prompt_opens_reasoning
from freetoken.chat.markup import MarkupError
from freetoken.chat.reasoning.think import CLOSE as THINK_CLOSE
from freetoken.chat.template import render_and_tokenize
from freetoken.chat.tokenize import chars_per_token_bound, encode
from freetoken.runner.sampling_params import SamplingParams
from freetoken.server.errors import APIError, context_overflow, from_engine_error
from freetoken.server.internal import (
    ChatRequest,
    Completion,
    Finish,
    FinishReason,
    Started,
    TokenLogprobs,
    ToolCall,
    merge_leading_system,
)
from freetoken.server.scrub import NoMarkup, markup_tags
from freetoken.server.stops import StopFilter
from freetoken.server.structured import parsers, reasoning_mode, request_grammar

if TYPE_CHECKING:
    from freetoken.engine.async_llm import AsyncLLM
    from freetoken.server.metrics import ServerMetrics

# A prompt past the context with at most this many characters is still tokenised for its refusal's count.
COUNT_UP_TO_CHARS = 1 << 18  # 256 KiB: ~0.6 s of a loaded core; an agent's first request is 30-80 kB
Event = Any  # one of freetoken.chat.events' dataclasses, or Finish
Events = AsyncGenerator[Any, None]


def template_kwargs(req: ChatRequest) -> dict[str, Any]:
    """What the chat template gets beside the messages and tools: the caller's own kwargs, the reasoning switch
    (``enable_thinking``) and level (``reasoning_effort``: gpt-oss harmony's "Reasoning: <level>" system line)."""
    kwargs: dict[str, Any] = dict(req.template_kwargs)
    if req.reasoning is not None:
        kwargs["enable_thinking"] = req.reasoning
    if req.reasoning_effort is not None:
        kwargs["reasoning_effort"] = req.reasoning_effort
    return kwargs


@dataclass
class Prepared:
    request: ChatRequest
    prompt_ids: list[int]
    params: SamplingParams
    starts_in_reasoning: bool
    forced_calls: bool = False  # the grammar allows nothing but calls after the reasoning block
    stops: list[str] = field(default_factory=list)  # stop sequences, matched in the answer's text (stops.py)


class Generation:
    def __init__(
        self,
        engine: AsyncLLM,
        metrics: ServerMetrics,
        family: str | None,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.family = family  # None: plain text output (no tool or reasoning markup known)
        self.tool_parser, self.reasoning_parser = tool_parser, reasoning_parser
        self._chars_per_token: int | None = None  # 0: no bound known for this tokenizer

    # ---- prompt -------------------------------------------------------------------------
    def render(self, req: ChatRequest) -> list[int]:
        tok, template = self.engine.tokenizer, self.engine.chat_template
        if tok is None or not template:
            raise APIError.invalid("this model has no tokenizer or no chat template, so it cannot serve chat requests")
        tools = [t.template_dict() for t in self._prompt_tools(req)] or None
        kwargs: dict[str, Any] = {"add_generation_prompt": True, **template_kwargs(req)}
        try:
            return render_and_tokenize(tok, template, merge_leading_system(req.messages), tools, **kwargs)
        except APIError:
            raise
        except MarkupError as exc:
            raise APIError.invalid(str(exc)) from exc
        except Exception as exc:  # a template that refuses the conversation is the caller's problem
            raise APIError.invalid(f"could not apply the chat template: {exc}") from exc

    def prepare(self, req: ChatRequest) -> Prepared:
        req.validate()
        self._refuse_far_too_long(req)
        prompt_ids = self.render(req)
        starts_in_reasoning = self._starts_in_reasoning(prompt_ids)
        limit = self.engine.max_model_len
        left = limit - len(prompt_ids)
        if left < 1:
            raise context_overflow(len(prompt_ids), limit - 1)
        max_tokens = left if req.max_tokens is None else min(req.max_tokens, left)
        tool_parser, reasoning_parser = parsers(self.family, self.tool_parser, self.reasoning_parser)
        mode = reasoning_mode(req, reasoning_parser, starts_in_reasoning)
        grammar = request_grammar(req, self._prompt_tools(req), self.engine.tokenizer, tool_parser, mode, max_tokens)
        try:
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=req.top_k,
                min_p=req.min_p,
                presence_penalty=req.presence_penalty,
                frequency_penalty=req.frequency_penalty,
                repetition_penalty=req.repetition_penalty,
                logprobs=req.logprobs,
                stop=list(req.stop),
                seed=req.seed,
                ignore_eos=req.ignore_eos,
                skip_special_tokens=False,  # the parsers need <tool_call>/<think> markers
                grammar=grammar,
            )
        except ValueError as exc:  # e.g. top_k < -1: the engine's own checks
            raise APIError.invalid(str(exc)) from exc
        stops, params.stop = params.stop_strings, []  # applied to the answer here (stops.py), not to raw text
        forced = grammar is not None and req.tool_choice.mode in ("required", "named")
        return Prepared(req, prompt_ids, params, starts_in_reasoning, forced, stops)

    def count(self, req: ChatRequest) -> int:
        """The prompt's tokens (``/v1/messages/count_tokens``), under the limits ``prepare`` applies."""
        return len(self.prompt_of(req))

    def prompt_of(self, req: ChatRequest) -> list[int]:
        """The prompt's tokens (``/v1/tokenize``), under the limits ``prepare`` applies: a prompt the context
        cannot hold is refused the same way (past ``COUNT_UP_TO_CHARS``, untokenised)."""
        req.validate()
        self._refuse_far_too_long(req)
        ids = self.render(req)
        if len(ids) >= self.engine.max_model_len:
            raise context_overflow(len(ids), self.engine.max_model_len - 1)
        return ids

    def _refuse_far_too_long(self, req: ChatRequest) -> None:
        self.refuse_far_too_long(req.text_chars())

    def refuse_far_too_long(self, chars: int) -> None:
        """A prompt with more characters than the context could hold tokens is refused before it is
        rendered and tokenised (a 16 MB body would otherwise cost seconds of a core). Below
        ``COUNT_UP_TO_CHARS`` it is tokenised all the same, so the refusal gives the true count: an agent
        shows it to its user ("~4202 tokens" for Claude Code's 37,384-token request misleads)."""
        if self._chars_per_token is None:
            tok = self.engine.tokenizer
            self._chars_per_token = (chars_per_token_bound(tok) if tok is not None else None) or 0
        if not self._chars_per_token:
            return
        at_least = chars // self._chars_per_token
        limit = self.engine.max_model_len
        if at_least >= limit and chars > COUNT_UP_TO_CHARS:
            raise context_overflow(at_least, limit - 1, counted=False)

    @staticmethod
    def _prompt_tools(req: ChatRequest) -> list[Any]:
        if req.tool_choice.mode == "none":
            return []
        if req.tool_choice.mode == "named":
            return [t for t in req.tools if t.name == req.tool_choice.name]
        return list(req.tools)

    def _starts_in_reasoning(self, prompt_ids: list[int]) -> bool:
        tok = self.engine.tokenizer
        tail = tok.decode(prompt_ids[-8:], skip_special_tokens=False) if tok is not None else ""
        return prompt_opens_reasoning(tail)

    # ---- generation ---------------------------------------------------------------------
    async def stream(self, prep: Prepared, request_id: str | None = None) -> AsyncGenerator[Event, None]:
        """Parser events, then one ``Finish``. Raises ``APIError`` before the first event on refusal."""
        req = prep.request
        none = req.tool_choice.mode == "none"  # calls are read (to be dropped, scrub.py), never answered
        parser = make_stream_parser(
            self.family,
            [t.template_dict() for t in (req.tools if none else self._prompt_tools(req))],
            prep.starts_in_reasoning,
            reasoning=True,
            tool_parser=self.tool_parser,
            reasoning_parser=self.reasoning_parser,
        )
        shaper = _Shaper(req.parallel_tool_calls)
        stopper = StopFilter(prep.stops)
        tags = markup_tags(*parsers(self.family, self.tool_parser, self.reasoning_parser), self.engine.tokenizer)
        scrub = NoMarkup(tags) if none else None

        def pipe(events: list[Any], end: bool = False) -> list[Any]:
            """The parser's events tidied, without markup (tool_choice none), up to a stop sequence."""
            out = shaper.apply(events)
            if scrub is not None:
                out = scrub.apply(out) + (scrub.flush() if end else [])
            return stopper.apply(out) + (stopper.flush() if end else [])

        rid = request_id or f"req-{uuid.uuid4().hex}"
        start = time.perf_counter()
        first_at: float | None = None
        out_ids: list[int] = []
        reason, completion_tokens, prompt_tokens = "abort", 0, len(prep.prompt_ids)
        cached_tokens = 0
        reasoning: list[str] = []
        saw_tool = False
        self.metrics.request_started()
        try:
            engine_stream = cast(AsyncGenerator[Any, None], self.engine.generate(prep.prompt_ids, prep.params, rid))
            async with aclosing(engine_stream) as outputs:
                async for out in outputs:
                    if first_at is None:
                        first_at = time.perf_counter()
                        self.metrics.first_token(first_at - start)
                        yield Started()  # accepted and prefilled: streams may send their headers now
                    out_ids.extend(out.new_token_ids)
                    if out.logprobs:
                        yield TokenLogprobs(out.logprobs)
                    for e in pipe(parser.feed(out.new_text) if out.new_text else []):
                        saw_tool = saw_tool or isinstance(e, ev.ToolCallStart)
                        if isinstance(e, ev.ReasoningDelta):
                            reasoning.append(e.text)
                        yield e
                    if stopper.matched is not None:  # closing the engine stream (aclosing) aborts the request
                        reason, completion_tokens = "stop", len(out_ids)
                        break
                    if out.finished:
                        if out.finish_reason == "error":
                            raise APIError("server_error", f"generation failed: {out.error or 'engine error'}")
                        reason = out.finish_reason or "stop"
                        completion_tokens = out.completion_tokens or len(out_ids)
                        prompt_tokens = out.prompt_tokens or prompt_tokens
                        cached_tokens = getattr(out, "cached_tokens", 0)
                        break
            tail = parser.finish()
            if prep.forced_calls and reason == "length":  # a forced call cut short is no text: drop it
                tail = [e for e in tail if not isinstance(e, ev.ContentDelta)]
            for e in pipe(tail, end=True):
                saw_tool = saw_tool or isinstance(e, ev.ToolCallStart)
                if isinstance(e, ev.ReasoningDelta):
                    reasoning.append(e.text)
                yield e
        except APIError:
            raise
        except Exception as exc:
            raise from_engine_error(exc) from exc
        finally:
            self.metrics.request_finished(len(out_ids), time.perf_counter() - start)
        fin = self._finish(reason, saw_tool, stopper.matched, prompt_tokens, completion_tokens)
        fin.cached_tokens = cached_tokens
        # tokenising the reasoning text holds the interpreter: on a thread, not the event loop every stream shares
        fin.reasoning_tokens = await asyncio.to_thread(self._reasoning_tokens, "".join(reasoning), out_ids,
                                                       completion_tokens)  # fmt: skip
        yield fin

    @staticmethod
    def _finish(
        reason: str, saw_tool: bool, stop_seq: str | None, prompt_tokens: int, completion_tokens: int
    ) -> Finish:
        final: FinishReason
        if reason == "length":
            final = "length"
        elif reason == "abort":
            final = "abort"
        elif saw_tool:
            final = "tool_calls"
        else:
            final = "stop_sequence" if stop_seq is not None else "stop"
        return Finish(final, prompt_tokens, completion_tokens, stop_seq if final == "stop_sequence" else None)

    def _reasoning_tokens(self, reasoning: str, out_ids: list[int], completion_tokens: int) -> int:
        """Output tokens up to the end of the reasoning block: where the block's closing tag is one token,
        up to that token; otherwise the reasoning text's own tokens (plus its two tags)."""
        if not reasoning:
            return 0
        tok = self.engine.tokenizer
        close = tok.convert_tokens_to_ids(THINK_CLOSE) if tok is not None else None
        if isinstance(close, int) and close in out_ids and close != getattr(tok, "unk_token_id", None):
            return out_ids.index(close) + 1
        if tok is None:
            return 0
        return min(completion_tokens, len(encode(tok, reasoning, special=True)) + 2)

    async def complete(self, prep: Prepared, request_id: str | None = None) -> Completion:
        content: list[str] = []
        reasoning: list[str] = []
        calls: dict[int, ToolCall] = {}
        finish: Finish | None = None
        logprobs: list[tuple[int, float, list[tuple[int, float]]]] = []
        async with aclosing(self.stream(prep, request_id)) as events:
            async for e in events:
                if isinstance(e, TokenLogprobs):
                    logprobs += e.entries
                elif isinstance(e, ev.ContentDelta):
                    content.append(e.text)
                elif isinstance(e, ev.ReasoningDelta):
                    reasoning.append(e.text)
                elif isinstance(e, ev.ToolCallStart):
                    calls[e.index] = ToolCall(e.index, e.id, e.name, "")
                elif isinstance(e, ev.ToolCallArgsDelta):
                    calls[e.index].arguments += e.text
                elif isinstance(e, Finish):
                    finish = e
        assert finish is not None
        tool_calls = [calls[i] for i in sorted(calls)]
        return Completion("".join(content), "".join(reasoning), tool_calls, finish, logprobs)

    async def feed_all(self, prep: Prepared, builder: Any) -> None:
        """Run a request to completion, feeding every event to a protocol builder (non-streaming answers)."""
        async with aclosing(self.stream(prep, builder.id)) as events:
            async for e in events:
                builder.feed(e)

    async def first_event(self, events: AsyncGenerator[Event, None]) -> Event:
        """The first event (``Started`` once the engine produced output, or an early ``Finish``), so
        refusals (queue full, too long, engine dead) become HTTP errors before any header goes out."""
        return await events.__anext__()


class _Shaper:
    """Tidies parser events for clients: whitespace that follows reasoning or a tool call is held
    back until visible text follows (then dropped), so no blank text block sits between reasoning
    and a call; with ``parallel_tool_calls`` off only the first call is kept."""

    def __init__(self, parallel: bool) -> None:
        self.parallel = parallel
        self.trim = False  # True after a non-content event, until visible content arrives

    def apply(self, events: list[Any]) -> list[Any]:
        out: list[Any] = []
        for e in events:
            if isinstance(e, ev.ContentDelta):
                text = e.text.lstrip() if self.trim else e.text
                if text:
                    self.trim = False
                    out.append(ev.ContentDelta(text))
                continue
            self.trim = True
            index = getattr(e, "index", None)
            if not self.parallel and index is not None and index > 0:
                continue
            out.append(e)
        return out


async def until_finish(first: Event, events: Events) -> AsyncGenerator[Event, None]:
    """``first`` then the rest of ``events`` up to and including the ``Finish``; closes ``events`` when done.
    Callers wrap it in ``aclosing`` so a client disconnect closes the engine stream (and aborts) at once."""
    async with aclosing(events):
        e = first
        while True:
            yield e
            if isinstance(e, Finish):
                return
            e = await events.__anext__()
