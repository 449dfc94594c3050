"""Structured output through llguidance: a grammar (Lark in llguidance's dialect, where
``%json {…}`` embeds a JSON schema and ``<name>`` a special token) compiled against the model's
tokenizer into a per-request matcher, the engine's ``TokenConstraint``.

Compiling (building the tokenizer's token trie once, then each grammar) runs on the caller's
thread, not the engine's: ``AsyncLLM`` compiles before it queues the request.
"""

from __future__ import annotations

import copy
import functools
import threading
from typing import Any

import llguidance
import torch

from freetoken.checkpoint.tiktoken_tokenizer import without_chunk_cut
from freetoken.engine.errors import InputError
from freetoken.runner.constraint import bitmask_words


class GrammarCompiler:
    """Grammars for one tokenizer and vocabulary (the model's: the logits' width, which may exceed
    the tokenizer's, or fall short of it: Kimi's tokenizer has two ids past the model's vocabulary).

    llguidance works over ``max(vocab_size, tokenizer size)`` ids; ids past the model's vocabulary
    have no logit, so they are never sampled, and the masks handed to the engine stop at its width."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        self._source = tokenizer
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._lock = threading.Lock()
        self._tok: llguidance.LLTokenizer | None = None

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:  # built once (about a second for a large vocabulary), on first use
            if self._tok is None:
                if self._source is None:
                    raise InputError("this model has no tokenizer, so it cannot follow a grammar")
                self._tok = _ll_tokenizer(self._source, self.vocab_size, self._eos)
            return self._tok

    def compile(self, grammar: str) -> GrammarConstraint:
        """A fresh matcher for ``grammar``; ``InputError`` naming the fault when it is not valid."""
        ll = _to_llguidance(grammar)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(ll, self.tokenizer)
        if is_error:
            raise InputError(f"invalid grammar: {messages[0] if messages else 'rejected'}")
        matcher = llguidance.LLMatcher(self.tokenizer, ll, log_level=0)
        if matcher.is_error():
            raise InputError(f"invalid grammar: {matcher.get_error()}")
        return GrammarConstraint(matcher, bitmask_words(self.tokenizer.vocab_size))


def _ll_tokenizer(source: Any, vocab_size: int, eos: list[int]) -> llguidance.LLTokenizer:
    """``llguidance.hf.from_tokenizer``'s build, over at least every id of the tokenizer, and with the tiktoken
    chunk cut (``checkpoint/tiktoken_tokenizer.py``) left out of the pre-tokenizer, which llguidance compiles."""
    backend = getattr(source, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("llguidance needs a fast (tokenizers) tokenizer")
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    n_vocab = max(vocab_size, int(backend.get_vocab_size(with_added_tokens=True)))
    return llguidance.LLTokenizer(without_chunk_cut(backend.to_str()), n_vocab=n_vocab, eos_token=eos)


def check_grammar(syntax: str, definition: str) -> None:
    """``InputError`` naming the fault when ``definition`` (``syntax`` "lark", llguidance's dialect, or
    "regex") does not compile. Needs no tokenizer, so it checks grammars the request carries but the engine
    may never enforce (a custom tool the model is free not to call); ``<name>`` tokens are checked when
    enforced."""
    try:
        if syntax == "regex":
            ll = str(llguidance.LLMatcher.grammar_from_regex(definition))
        else:
            ll = _to_llguidance(definition)
    except (ValueError, RuntimeError) as exc:  # llguidance's parse errors
        raise InputError(f"invalid grammar ({syntax}): {exc}") from exc
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(ll, None)
    if is_error:
        raise InputError(f"invalid grammar ({syntax}): {messages[0] if messages else 'rejected'}")


@functools.lru_cache(maxsize=256)
def _to_llguidance(grammar: str) -> str:
    return str(llguidance.LLMatcher.grammar_from_lark(grammar))


class GrammarConstraint:
    """One request's position in its grammar (``TokenConstraint``)."""

    def __init__(self, matcher: llguidance.LLMatcher, words: int) -> None:
        self._m = matcher
        self._words = words  # llguidance's mask width: ids past the model's vocabulary included
        self._scratch: torch.Tensor | None = None

    def fill_bitmask(self, bitmask: torch.Tensor) -> None:
        """The model's mask (``[ceil(V/32)]``, V the model's vocabulary): llguidance's, cut to that width when the
        tokenizer has more ids (the bits past V in the last word are never read: ``runner/constraint.py``)."""
        assert bitmask.dtype == torch.int32 and bitmask.is_contiguous() and bitmask.device.type == "cpu"
        assert bitmask.numel() <= self._words, (bitmask.numel(), self._words)
        if bitmask.numel() == self._words:
            self._m.unsafe_compute_mask_ptr(bitmask.data_ptr(), self._words * 4)
            return
        if self._scratch is None:
            self._scratch = torch.empty(self._words, dtype=torch.int32)
        self._m.unsafe_compute_mask_ptr(self._scratch.data_ptr(), self._words * 4)
        bitmask.copy_(self._scratch[: bitmask.numel()])

    def accept(self, token: int) -> bool:
        return bool(self._m.consume_token(token)) and not self._m.is_error()

    def is_done(self) -> bool:
        return bool(self._m.is_stopped())

    def error(self) -> str:
        return str(self._m.get_error())
