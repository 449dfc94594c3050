"""Rendering a checkpoint's chat template safely.

Templates come from the checkpoint (tokenizer_config.json / chat_template.jinja): untrusted code,
so they run in Jinja's immutable sandbox with the extras HF templates expect (`raise_exception`,
a `tojson` with ensure_ascii/indent, `strftime_now`, a guarded `namespace`, no-op
`{% generation %}` blocks). `render_and_tokenize` also keeps untrusted message text as text: a
`<|im_end|>` typed by a user is tokenised as characters, never as the special token.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from freetoken.chat.align import pieces_from
from freetoken.chat.markup import check_no_markup, control_strings
from freetoken.chat.sentinels import Sentinels, mark_json
from freetoken.chat.tokenize import encode, encode_pieces, special_token_strings, template_token_kwargs


class TemplateRenderError(ValueError):
    """The template failed, or untrusted text could not be kept apart from template text."""


class _Generation(Extension):
    """`{% generation %}…{% endgeneration %}` (HF assistant-mask marker): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


class _Namespace(jinja2.utils.Namespace):
    """`namespace()` that refuses underscore attributes (no reaching CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    dumped = json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    return mark_json(dumped, ensure_ascii)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def make_environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env


def pick_template(
    chat_template: str | list[dict[str, str]] | dict[str, str],
    has_tools: bool = False,
    name: str | None = None,
) -> str:
    """The template text from tokenizer_config.json's `chat_template`, which is a string or a list
    of named templates (HF picks `tool_use` when tools are given, else `default`)."""
    if isinstance(chat_template, str):
        return chat_template
    named = (
        {t["name"]: t["template"] for t in chat_template if isinstance(t, dict) and "name" in t}
        if isinstance(chat_template, list)
        else dict(chat_template)
    )
    for key in (name, "tool_use" if has_tools else None, "default"):
        if key and key in named:
            return named[key]
    raise TemplateRenderError(
        f"no chat template named {name or 'default'!r}; have: {', '.join(sorted(named))}"
    )


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    try:
        return make_environment().from_string(source)
    except jinja2.TemplateError as e:
        raise TemplateRenderError(f"chat template does not compile: {e}") from e


def prepare_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-shape messages as templates expect them: tool-call `arguments` given as JSON text
    become objects (Qwen3-Coder, GLM and MiniMax templates iterate over them)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            m = {**m, "tool_calls": [_parse_call_args(c) for c in calls]}
        out.append(m)
    return out


def _parse_call_args(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    call = dict(call)
    if isinstance(call.get("function"), dict):
        call["function"] = _parse_call_args(call["function"])
    args = call.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            call["arguments"] = parsed
    return call


def render(
    template: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    **kwargs: Any,
) -> str:
    """The prompt text. `kwargs` reach the template (`enable_thinking`, `bos_token`, ...)."""
    return _render(template, prepare_messages(messages), tools, add_generation_prompt, kwargs)


def _render(
    template: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    kwargs: dict[str, Any],
) -> str:
    try:
        return compile_template(template).render(
            messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
        )
    except jinja2.TemplateError as e:  # raise_exception, sandbox refusals, undefined calls
        raise TemplateRenderError(str(e)) from e


def render_pieces(
    template: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool = False,
    **kwargs: Any,
) -> list[tuple[str, bool]] | None:
    """The prompt as (text, is_untrusted) pieces whose concatenation equals `render(...)`;
    None when the template's handling of the text defeats both the sentinel and the alignment.

    `continue_final_message`: the prompt stops right after the last message's text (an
    assistant prefill the model continues) instead of closing that turn.
    """
    if continue_final_message and add_generation_prompt:
        raise TemplateRenderError("continue_final_message and add_generation_prompt exclude each other")
    prepared = prepare_messages(messages)
    plain = _render(template, prepared, tools, add_generation_prompt, kwargs)
    sentinels = Sentinels()
    protected, protected_tools = sentinels.protect(prepared), sentinels.protect_tools(tools)
    marked = _render(template, protected, protected_tools, add_generation_prompt, kwargs)
    texts, values = sentinels.split(marked)
    if not values:  # nothing untrusted was rendered, or the template mangled every sentinel
        pieces: list[tuple[str, bool]] | None = [(plain, False)] if marked == plain else None
    else:
        pieces = pieces_from(texts, values, plain)
    if pieces is not None and continue_final_message:
        pieces = _cut_after_final(pieces, messages[-1].get("content") if messages else None)
    return pieces


def _cut_after_final(pieces: list[tuple[str, bool]], final: Any) -> list[tuple[str, bool]]:
    target = final.strip() if isinstance(final, str) else ""
    if not target:
        raise TemplateRenderError("continue_final_message needs a final message with text content")
    for i in range(len(pieces) - 1, -1, -1):
        text, untrusted = pieces[i]
        j = text.rfind(target) if untrusted else -1
        if j >= 0:
            return pieces[:i] + [(text[: j + len(target)], True)]
    raise TemplateRenderError("the chat template does not render the final message's text")


def render_and_tokenize(
    tokenizer: Any,
    template: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool | None = None,
    continue_final_message: bool = False,
    **kwargs: Any,
) -> list[int]:
    """Prompt token ids: template text with special tokens recognised, untrusted text without.

    `add_generation_prompt` defaults to True unless `continue_final_message` (see render_pieces).
    `tokenizer`: a `tokenizers.Tokenizer` or an HF tokenizer (whose bos/eos strings are passed to
    the template unless given). Raises TemplateRenderError rather than let text that spells a
    special token through when it cannot be separated from the template text, and MarkupError when a
    name, key or id (rendered as template syntax) spells a control token (markup.py).
    """
    check_no_markup(messages, tools, kwargs, control_strings(tokenizer))
    kw = {**template_token_kwargs(tokenizer), **kwargs}
    gen = not continue_final_message if add_generation_prompt is None else add_generation_prompt
    pieces = render_pieces(template, messages, tools, gen, continue_final_message, **kw)
    if pieces is None:
        if continue_final_message:
            raise TemplateRenderError("cannot find the final message's text in the rendered prompt")
        specials = special_token_strings(tokenizer)
        plain = render(template, messages, tools, gen, **kw)
        if any(s in v for s in specials for v in _untrusted_strings(messages, tools)):
            raise TemplateRenderError("cannot keep message text apart from the chat template's markup")
        return encode(tokenizer, plain, special=True)
    return encode_pieces(tokenizer, pieces, special_token_strings(tokenizer))


def _untrusted_strings(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[str]:
    s = Sentinels()
    s.protect(prepare_messages(messages))
    s.protect_tools(tools)
    return s.values
