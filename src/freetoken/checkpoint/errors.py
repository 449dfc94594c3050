"""Checkpoint errors: one clear line naming the file or tensor at fault."""

from __future__ import annotations

from freetoken.errors import FreeTokenError


class CheckpointError(FreeTokenError):
    """The checkpoint directory cannot be used as it is."""
