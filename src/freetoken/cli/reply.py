"""A chat reply as the terminal shows it (``ft chat``, ``ft generate --chat``): the model's text streamed through
its family's parser (``chat/registry.py``), the reasoning set apart between ``[thinking]`` and ``[/thinking]``
(dimmed on a terminal), then the answer. The answer alone goes back into the conversation."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from freetoken.chat import detect_family, make_stream_parser, prompt_opens_reasoning
from freetoken.chat import events as ev

DIM, RESET = "\x1b[2m", "\x1b[0m"


class ReplyPrinter:
    def __init__(self, tokenizer: Any, model_type: str | None, prompt_ids: list[int], out: TextIO = sys.stdout):
        tail = tokenizer.decode(prompt_ids[-8:], skip_special_tokens=False)
        family = detect_family(model_type, getattr(tokenizer, "chat_template", None))
        self.parser = make_stream_parser(family, None, prompt_opens_reasoning(tail))
        self.out, self.tty = out, out.isatty()
        self.thinking = False
        self.answer = ""

    def feed(self, text: str) -> None:
        self._show(self.parser.feed(text))

    def finish(self) -> str:
        """Flushes what the parser held; returns the answer (the reply without its reasoning)."""
        self._show(self.parser.finish())
        self._close()
        self.out.write("\n")
        self.out.flush()
        return self.answer

    def _show(self, events: list[ev.Event]) -> None:
        for e in events:
            if isinstance(e, ev.ReasoningDelta):
                if not self.thinking:
                    self.out.write((DIM if self.tty else "") + "[thinking]\n")
                    self.thinking = True
                self.out.write(e.text)
            elif isinstance(e, ev.ContentDelta):
                self._close()
                self.answer += e.text
                self.out.write(e.text)
        self.out.flush()

    def _close(self) -> None:
        if self.thinking:
            self.out.write("\n[/thinking]" + (RESET if self.tty else "") + "\n")
            self.thinking = False
