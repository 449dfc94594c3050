"""The base of every FreeToken error: any package may import it (it imports nothing of ours)."""

from __future__ import annotations


class FreeTokenError(Exception):
    """Base class of the errors FreeToken raises on purpose (bad input, a checkpoint it cannot use, ...)."""


class InputError(FreeTokenError, ValueError):
    """A request or setting the engine refuses (too long, bad ids, bad parameters, a budget it cannot run in)."""
