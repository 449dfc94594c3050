"""A scripted stand-in for ``AsyncLLM`` (tests only).

A random tiny model never writes a tool call or a think block, so the tests of those paths drive
the real HTTP server with this engine: it "generates" a scripted text, token by token, through a
real tokenizer, with the engine's contract (running limit, queue limit, abort on close, errors).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

from freetoken.engine.errors import EngineDeadError, PromptTooLongError, QueueFullError
from freetoken.engine.outputs import RequestOutput
from freetoken.runner.sampling_params import SamplingParams

QWEN_LIKE_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n"
    "{% endif %}# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n"
    'Call a tool as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call><|im_end|>\n'
    "{%- elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n"
    "{%- if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}{{ m.content }}"
    '{%- for tc in m.tool_calls or [] %}\n<tool_call>\n{"name": "{{ tc.function.name }}", "arguments": '
    "{{ tc.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}{%- endif %}"
)
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]


def build_tokenizer(path: str) -> Any:
    """A byte-level BPE tokenizer (≈ 400 tokens) with special tokens and a Qwen-like template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "hello world, the quick brown fox jumps over the lazy dog. " * 3,
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}',
        "You are a helpful assistant. Think step by step and answer briefly.",
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:2] + SPECIALS[3:],
    )
    fast.chat_template = QWEN_LIKE_TEMPLATE
    os.makedirs(path, exist_ok=True)
    fast.save_pretrained(path)
    return fast


class ScriptedEngine:
    """``script(prompt_ids) -> text`` decides the reply; by default a fixed function of the prompt."""

    def __init__(
        self,
        tokenizer: Any,
        script: Callable[[list[int]], str] | None = None,
        max_model_len: int = 1024,
        step_s: float = 0.002,
        max_running: int = 4,
        max_queued: int = 8,
        model_name: str = "tiny",
        fail_after: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template: str | None = tokenizer.chat_template
        self.model_name = model_name
        self.model_type = "qwen3_moe"
        self.max_model_len = max_model_len
        self.eos_token_ids = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        self.state = "ready"
        self.error: str | None = None
        self.script = script or (lambda ids: " ".join(["hello", "world", "fox", "dog"][i % 4] for i in ids[-6:]))
        self.step_s = step_s
        self.fail_after = fail_after  # emit an engine error after this many tokens
        self._slots = asyncio.Semaphore(max_running)
        self.max_queued = max_queued
        self.waiting = 0
        self.running = 0
        self.finished = 0
        self.aborted = 0

    async def wait_ready(self) -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "waiting": self.waiting,
            "finished": self.finished,
            "aborted": self.aborted,
            "expert_hits": 3,
            "expert_fills": 1,
            "expert_cpu_runs": 0,
        }

    def health(self) -> str | None:
        return None

    def check_integrity(self) -> None:
        assert self.running == 0 and self.waiting == 0, (self.running, self.waiting)

    async def shutdown(self, drain: bool = True) -> None:
        self.state = "dead"

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        if self.state == "dead":
            raise EngineDeadError(self.error or "engine stopped")
        if len(prompt_token_ids) >= self.max_model_len:
            raise PromptTooLongError(len(prompt_token_ids), self.max_model_len)
        if self._slots.locked() and self.waiting >= self.max_queued:
            raise QueueFullError("queue full")
        ids = self.tokenizer.encode(self.script(prompt_token_ids), add_special_tokens=False)
        ids = ids + self.eos_token_ids
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        done = False
        try:
            sent = 0  # characters of the decoded text already emitted
            for n, tid in enumerate(ids[: params.max_tokens]):
                await asyncio.sleep(self.step_s)
                if n == self.fail_after:
                    yield RequestOutput(request_id, [], "", True, "error", len(prompt_token_ids), n, "kernel fault")
                    done = True
                    return
                is_eos = tid in self.eos_token_ids
                text = self.tokenizer.decode(ids[: n + 1 - int(is_eos)], skip_special_tokens=False)
                hit = min((text.find(s) for s in params.stop_strings if s in text), default=-1)
                last = is_eos or hit >= 0 or n + 1 == params.max_tokens
                # Like the engine: never emit a tail that could still grow into a stop string.
                safe = hit if hit >= 0 else len(text) - _held(text, params.stop_strings, last)
                new, sent = text[sent:safe], max(sent, safe)
                reason = ("stop" if is_eos or hit >= 0 else "length") if last else None
                yield RequestOutput(request_id, [tid], new, last, reason, len(prompt_token_ids), n + 1)
                if last:
                    done = True
                    return
        finally:
            self.running -= 1
            self._slots.release()
            self.finished += int(done)
            self.aborted += int(not done)


def _held(text: str, stops: list[str], last: bool) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    if last:
        return 0
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
