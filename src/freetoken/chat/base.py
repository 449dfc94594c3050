"""The streaming parser contract the server drives."""

from __future__ import annotations

from abc import ABC, abstractmethod

from freetoken.chat.events import Event, ParsedMessage, accumulate


class StreamParser(ABC):
    """Feed model text as it is decoded; events come out as soon as they are decided.

    Tag prefixes are held back until decided, so the events do not depend on how the text is
    split; `finish()` flushes whatever is held (unclosed markup becomes content) and never raises.
    """

    @abstractmethod
    def feed(self, delta: str) -> list[Event]: ...

    @abstractmethod
    def finish(self) -> list[Event]: ...

    def parse_all(self, text: str) -> ParsedMessage:
        """Non-streaming use: all text at once (by construction equal to streaming it)."""
        return accumulate(self.feed(text) + self.finish())
