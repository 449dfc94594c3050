"""Streaming detokenisation: never emits half a UTF-8 character, holds back possible stop-string prefixes."""

from __future__ import annotations

from typing import Any

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Decodes a growing list of output ids into text deltas.

    Decoding a short window (``prefix_offset:``) rather than the whole output keeps each step O(1) and
    lets tokenizers that merge spaces across tokens decode consistently; a window ending in the
    replacement character is an incomplete UTF-8 sequence and is held back until it completes.
    """

    def __init__(
        self, tokenizer: Any | None, prompt_ids: list[int], stop: list[str], skip_special_tokens: bool
    ) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.stop = stop
        self.ids: list[int] = list(prompt_ids[-6:])  # a little context for the first window
        self.prefix_offset = max(len(self.ids) - 1, 0)
        self.read_offset = len(self.ids)
        self.text = ""  # all text decoded so far (stop string excluded once matched)
        self.sent = 0  # characters of ``text`` already handed out

    def _decode(self, ids: list[int]) -> str:
        assert self.tok is not None
        return str(self.tok.decode(ids, skip_special_tokens=self.skip))

    def add_token(self, token_id: int) -> tuple[str, bool]:
        """Adds one output token; returns (text safe to emit now, stop string matched)."""
        if self.tok is None:
            return "", False
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(_REPLACEMENT):
            self.text += full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
        return self._release()

    def _release(self) -> tuple[str, bool]:
        pending = self.text[self.sent :]
        for s in self.stop:
            idx = pending.find(s)
            if idx >= 0:
                self.text = self.text[: self.sent + idx]
                return self.flush(), True
        hold = 0
        for s in self.stop:  # longest suffix of pending that starts some stop string
            for n in range(min(len(s) - 1, len(pending)), hold, -1):
                if s.startswith(pending[-n:]):
                    hold = n
                    break
        out = pending[: len(pending) - hold]
        self.sent += len(out)
        return out, False

    def flush(self) -> str:
        """Everything not yet emitted (at the end of the request)."""
        out = self.text[self.sent :]
        self.sent = len(self.text)
        return out
