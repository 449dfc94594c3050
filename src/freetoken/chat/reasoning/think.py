"""`<think>…</think>` reasoning (Qwen3, DeepSeek-R1/V3.1, GLM-4.5/4.6, MiniMax-M2); Gemma-4's
`<|channel>thought\n…<channel|>` likewise (``GEMMA4_TAGS``).

Output may open with `<think>` (the model writes it) or start inside the block (the template put
`<think>` at the end of the prompt: `starts_in_reasoning`); then only `</think>` appears, and a
repeated opener is swallowed. One block, at the start: after `</think>` everything is content.
"""

from __future__ import annotations

from freetoken.chat.scan import split_safe

OPEN = "<think>"
CLOSE = "</think>"
GEMMA4_TAGS = ("<|channel>thought\n", "<channel|>")  # Gemma-4's thought channel (opener, closer)

# A segment of raw model text: (is_reasoning, text).
Segment = tuple[bool, str]


def prompt_opens_reasoning(prompt: str) -> bool:
    """True when the rendered prompt ends inside a think block (the template added `<think>`)."""
    return prompt.rstrip().endswith(OPEN)


class ThinkReasoningParser:
    def __init__(self, starts_in_reasoning: bool, tags: tuple[str, str] = (OPEN, CLOSE)) -> None:
        self._open, self._close = tags
        # "start": an opener may still come; "reasoning"; "content" (final, pass-through).
        self._state = "start"
        self._in_reasoning_at_start = starts_in_reasoning
        self._buf = ""

    def feed(self, text: str) -> list[Segment]:
        self._buf += text
        out: list[Segment] = []
        if self._state == "start":
            head = self._buf.lstrip()
            if head.startswith(self._open):
                self._buf = head[len(self._open) :]
                self._state = "reasoning"
            elif self._open.startswith(head):
                return out  # empty, whitespace or a partial opener: undecided
            else:
                self._state = "reasoning" if self._in_reasoning_at_start else "content"
        if self._state == "reasoning":
            before, tag, rest = split_safe(self._buf, [self._close])
            if before:
                out.append((True, before))
            if tag is None:
                self._buf = rest
                return out
            self._state, self._buf = "content", rest
        if self._buf:
            out.append((False, self._buf))
            self._buf = ""
        return out

    def finish(self) -> list[Segment]:
        """Whatever is held back is plain text of the current kind."""
        buf, self._buf = self._buf, ""
        if not buf:
            return []
        if self._state == "start":
            return [(self._in_reasoning_at_start, buf)]
        return [(self._state == "reasoning", buf)]
