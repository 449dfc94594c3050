"""Tokenizer and chat template from a checkpoint directory (transformers' fast tokenizer; no remote code).

A directory with ``tokenizer.json`` (or only ``tokenizer_config.json``) loads through ``AutoTokenizer``. One that ships
its vocabulary as ``tiktoken.model`` and no ``tokenizer.json`` (Kimi) is converted into a ``tokenizers`` BPE
(``checkpoint/tiktoken_tokenizer.py``, cached by ``checkpoint/tokenizer_cache.py``) and wrapped in a
``PreTrainedTokenizerFast`` with its ``tokenizer_config.json``'s special tokens and chat template.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.tiktoken_tokenizer import CONFIG_FILE, TIKTOKEN_FILE
from freetoken.checkpoint.tokenizer_cache import converted_tokenizer

log = logging.getLogger(__name__)

_NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "pad_token")
_PASSED = ("chat_template", "model_max_length", "clean_up_tokenization_spaces", "padding_side")


def load_tokenizer(directory: str | Path) -> Any | None:
    """The checkpoint's tokenizer, or None when the directory ships none (token-id prompts only)."""
    d = Path(directory)
    if (d / TIKTOKEN_FILE).exists() and not (d / "tokenizer.json").exists():
        tok = load_tiktoken_tokenizer(d)
    elif not ((d / "tokenizer.json").exists() or (d / CONFIG_FILE).exists()):
        return None
    else:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(d), trust_remote_code=False, local_files_only=True)
        except Exception as e:  # transformers raises many types here; name the file
            raise CheckpointError(f"{d}: cannot load the tokenizer ({type(e).__name__}: {e})") from e
    template = d / "chat_template.jinja"
    if not getattr(tok, "chat_template", None) and template.exists():
        tok.chat_template = template.read_text()
    return tok


def load_tiktoken_tokenizer(d: Path, cache_dir: str | None = None) -> Any:
    """A ``PreTrainedTokenizerFast`` over the converted ``tiktoken.model`` of ``d``."""
    config_path = d / CONFIG_FILE
    if not config_path.exists():
        raise CheckpointError(
            f"{d}: has {TIKTOKEN_FILE} but no {CONFIG_FILE}, which names its special tokens (their ids, the end of "
            f"a turn) and its pre-tokenizer (auto_map); the checkpoint's tokenizer files are incomplete"
        )
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{config_path}: cannot read it ({e})") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_path}: not a JSON object")
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(converted_tokenizer(d, config, cache_dir).text)
    kwargs: dict[str, Any] = {k: config[k] for k in _PASSED if config.get(k) is not None}
    template = d / "chat_template.jinja"
    if template.exists():  # as transformers loads it: the file wins over tokenizer_config.json's template
        kwargs["chat_template"] = template.read_text()
    for key in _NAMED_SPECIALS:
        name = _content(config.get(key))
        if name is None:
            continue
        if backend.token_to_id(name) is None:  # transformers would append it as a new token: a vocabulary of its own
            raise CheckpointError(f"{config_path}: {key} {name!r} is not a token of {TIKTOKEN_FILE} or its specials")
        kwargs[key] = name
    extra = [n for n in map(_content, config.get("additional_special_tokens") or []) if n is not None]
    unknown = [n for n in extra if backend.token_to_id(n) is None]
    if unknown:
        raise CheckpointError(f"{config_path}: additional_special_tokens names {unknown[0]!r}, which is no token")
    return PreTrainedTokenizerFast(tokenizer_object=backend, additional_special_tokens=extra, **kwargs)


def _content(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or an AddedToken object."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None
