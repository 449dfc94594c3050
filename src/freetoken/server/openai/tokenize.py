"""``POST /v1/tokenize`` (``{prompt}`` or ``{messages}`` → ``{tokens, count, max_model_len}``) and
``POST /v1/detokenize`` (``{tokens}`` → ``{prompt}``), under generation's limits: the body limit, and a prompt the
context cannot hold is refused as generation refuses it. ``prompt_token_ids`` is ``/v1/completions``' prompt."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from freetoken.chat.tokenize import encode
from freetoken.server.body import parse_request
from freetoken.server.errors import APIError, context_overflow
from freetoken.server.generation import Generation
from freetoken.server.openai.protocol import ChatCompletionRequest, DetokenizeRequest, Prompt, TokenizeRequest
from freetoken.server.state import get_state


def vocab_size(gen: Generation) -> int:
    size = getattr(gen.engine, "vocab_size", None)
    return int(size) if size is not None else len(gen.engine.tokenizer)


def check_ids(gen: Generation, ids: list[int], param: str) -> None:
    """Every id inside the vocabulary, and no more of them than the context holds (a 400 naming the field)."""
    vocab = vocab_size(gen)
    bad = next((i for i, t in enumerate(ids) if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError.invalid(f"{param}[{bad}]: token id {ids[bad]} is outside the vocabulary [0, {vocab})",
                               param=f"{param}.{bad}")  # fmt: skip
    if len(ids) >= gen.engine.max_model_len:
        raise context_overflow(len(ids), gen.engine.max_model_len - 1)


def prompt_token_ids(gen: Generation, prompt: Prompt, add_special_tokens: bool = True) -> list[int]:
    """One prompt's ids: token ids as given, or a string tokenised (special-token strings read as the tokens, the
    tokenizer's BOS first where it adds one), refused past the context like generation refuses it."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise APIError.invalid("one prompt per request (send each prompt as its own request)", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, list):
        ids = [int(t) for t in prompt]  # type: ignore[arg-type]
        check_ids(gen, ids, "prompt")
        return ids
    tok = gen.engine.tokenizer
    if tok is None:
        raise APIError.invalid("this model has no tokenizer: send the prompt as token ids", param="prompt")
    gen.refuse_far_too_long(len(prompt))
    ids = encode(tok, prompt, special=True)
    if add_special_tokens:
        bos = getattr(tok, "bos_token_id", None)
        if bos is not None and tok("", add_special_tokens=True)["input_ids"][:1] == [bos]:
            ids = [bos, *ids]
    if len(ids) >= gen.engine.max_model_len:
        raise context_overflow(len(ids), gen.engine.max_model_len - 1)
    return ids


def _messages_ids(gen: Generation, body: TokenizeRequest) -> list[int]:
    from freetoken.server.openai.chat_completions import to_internal

    kwargs: dict[str, Any] = {**(body.chat_template_kwargs or {}), "add_generation_prompt": body.add_generation_prompt}
    chat = ChatCompletionRequest(model=body.model or "", messages=body.messages or [], tools=body.tools,
                                 chat_template_kwargs=kwargs)  # fmt: skip
    return gen.prompt_of(to_internal(chat))


async def tokenize(request: Request) -> JSONResponse:
    state = get_state(request)
    body = await parse_request(request, TokenizeRequest)
    if (body.prompt is None) == (body.messages is None):
        raise APIError.invalid("send either prompt (text) or messages (a chat), not both or neither", param="prompt")
    gen = state.generation()
    if body.messages is not None:
        ids = await state.off_loop(request, lambda: _messages_ids(gen, body))
    else:
        text = body.prompt or ""
        ids = await state.off_loop(request, lambda: prompt_token_ids(gen, text, body.add_special_tokens))
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": gen.engine.max_model_len})


async def detokenize(request: Request) -> JSONResponse:
    state = get_state(request)
    body = await parse_request(request, DetokenizeRequest)
    gen = state.generation()
    check_ids(gen, body.tokens, "tokens")
    tok = gen.engine.tokenizer
    if tok is None:
        raise APIError.invalid("this model has no tokenizer, so tokens cannot be turned into text")
    text = await state.off_loop(request, lambda: tok.decode(body.tokens, skip_special_tokens=False))
    return JSONResponse({"prompt": text})
