"""Tokenizer and chat template from a checkpoint directory (transformers' fast tokenizer; no remote code)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from freetoken.checkpoint.errors import CheckpointError

log = logging.getLogger(__name__)


def load_tokenizer(directory: str | Path) -> Any | None:
    """The checkpoint's tokenizer, or None when the directory ships none (token-id prompts only)."""
    d = Path(directory)
    if not ((d / "tokenizer.json").exists() or (d / "tokenizer_config.json").exists()):
        return None
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(d), trust_remote_code=False, local_files_only=True)
    except Exception as e:  # transformers raises many types here; name the file
        raise CheckpointError(f"{d}: cannot load the tokenizer ({type(e).__name__}: {e})") from e
    template = d / "chat_template.jinja"
    if not getattr(tok, "chat_template", None) and template.exists():
        tok.chat_template = template.read_text()
    return tok
