"""evaluate.py's held-out evaluation through the server and the official SDKs: OpenAI chat completions and
Anthropic messages.

    PYTHONPATH=src python -m training.default_model_v2.evaluate_http --model DIR            # starts the server
    PYTHONPATH=src python -m training.default_model_v2.evaluate_http --model DIR --url http://127.0.0.1:8000

The same held-out sets as evaluate.py (its drawing code, seeds and sizes, measured with the model's tokenizer:
`--model` is needed with `--url` too), each conversation sent in each API's own shape: the system prompt, the tool
catalogue (OpenAI function tools; Anthropic `input_schema` tools), the history with the assistant's tool calls
and the tool results (OpenAI `tool_calls` + `role: tool`; Anthropic `tool_use` / `tool_result` blocks), the
request last; temperature 0, evaluate.py's max tokens. Scored as evaluate.py scores (its `score`), per API, each
figure printed as soon as its set is done. `--concurrency` requests are in flight at once (the engine batches).

Without `--url` the script serves `--model` itself: `ft serve`'s app (`server.app.build_app`) under uvicorn on
127.0.0.1 on a free port, in this process, with the engine's prompt ids recorded, so every request is also checked
token for token against the prompt evaluate.py renders (`[eval <api>] prompts: ...`). One difference is expected:
the server passes each tool to the template as `ToolSpec.template_dict()` (type, function: name, description,
parameters), so a catalogue drawn with sorted keys (15%) is rendered in the server's key order; those prompts are
compared with evaluate.py's rendering of the same tools in that order. With `--url` only the prompt token counts
(`usage`) are compared.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from training.default_model_v2.evaluate import Answerer, Conversation, Prompts, Reply, add_set_args, evaluate, renderer

MODEL_ALIAS = "freetoken-v2"


# ---- the conversation in each API's shape -------------------------------------------------------------------
def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    return dict(call["function"]["arguments"])


def _check_keys(m: dict[str, Any]) -> None:
    extra = set(m) - {"role", "content", "tool_calls", "_train"}  # _train: a training mark, not sent
    if extra:
        raise ValueError(f"message keys {sorted(extra)} have no mapping to the APIs here: {m['role']} message")


def openai_kwargs(conv: Conversation) -> dict[str, Any]:
    """Chat-completions arguments: messages in order (the system prompt a system message), assistant calls as
    `tool_calls` (arguments as JSON text, ids call_0, call_1, ...), each result a `role: tool` message answering
    the oldest call not answered yet; tools as drawn (already OpenAI function tools)."""
    msgs: list[dict[str, Any]] = []
    pending: list[str] = []
    n_calls = 0
    for m in conv["messages"]:
        _check_keys(m)
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                pending.append(f"call_{n_calls}")
                n_calls += 1
                calls.append({"id": pending[-1], "type": "function",
                              "function": {"name": tc["function"]["name"], "arguments": json.dumps(_arguments(tc))}})
            msgs.append({"role": "assistant", "content": m["content"], "tool_calls": calls})
        elif m["role"] == "tool":
            msgs.append({"role": "tool", "tool_call_id": pending.pop(0), "content": m["content"]})
        else:
            msgs.append({"role": m["role"], "content": m["content"]})
    return {"messages": msgs, "tools": conv["tools"]}


def anthropic_kwargs(conv: Conversation) -> dict[str, Any]:
    """Messages arguments: a leading system message becomes `system`; assistant calls `tool_use` blocks (ids
    toolu_0, ...; after a text block when the turn has text); results `tool_result` blocks in one user message
    (a user text right after them joins it, as the API requires turns to alternate); tools as
    {name, description, input_schema}."""
    src = conv["messages"]
    kw: dict[str, Any] = {}
    if src and src[0]["role"] == "system":
        kw["system"], src = src[0]["content"], src[1:]
    msgs: list[dict[str, Any]] = []
    pending: list[str] = []
    n_calls = 0
    for m in src:
        _check_keys(m)
        if m["role"] == "assistant":
            if not m.get("tool_calls"):
                msgs.append({"role": "assistant", "content": m["content"]})
                continue
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m["content"]}] if m["content"] else []
            for tc in m["tool_calls"]:
                pending.append(f"toolu_{n_calls}")
                n_calls += 1
                blocks.append({"type": "tool_use", "id": pending[-1], "name": tc["function"]["name"],
                               "input": _arguments(tc)})
            msgs.append({"role": "assistant", "content": blocks})
        elif m["role"] in ("tool", "user"):
            block = ({"type": "tool_result", "tool_use_id": pending.pop(0), "content": m["content"]}
                     if m["role"] == "tool" else {"type": "text", "text": m["content"]})
            if msgs and msgs[-1]["role"] == "user" and isinstance(msgs[-1]["content"], list):
                msgs[-1]["content"].append(block)
            elif m["role"] == "tool":
                msgs.append({"role": "user", "content": [block]})
            else:
                msgs.append({"role": "user", "content": m["content"]})
        else:
            raise ValueError(f"a {m['role']} message after the first has no Anthropic shape")
    kw["messages"] = msgs
    kw["tools"] = [{"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
                   for f in (t["function"] for t in conv["tools"])]
    return kw


def server_shaped(conv: Conversation) -> Conversation:
    """The conversation with each tool in the key order the server hands the template
    (`ToolSpec.template_dict`); the schema itself as drawn."""
    from freetoken.server.internal import ToolSpec

    tools = [ToolSpec(f["name"], f["description"], f["parameters"]).template_dict()
             for f in (t["function"] for t in conv["tools"])]
    return {**conv, "tools": tools}


# ---- one request per API -> the Reply evaluate.py scores ------------------------------------------------------
def openai_reply(client: Any, model: str, conv: Conversation, max_tokens: int) -> tuple[Reply, int]:
    r = client.chat.completions.create(model=model, temperature=0, max_tokens=max_tokens, **openai_kwargs(conv))
    msg = r.choices[0].message
    calls = msg.tool_calls or []
    call = None
    if calls:
        try:
            args = json.loads(calls[0].function.arguments)
            call = (calls[0].function.name, args) if isinstance(args, dict) else None
        except ValueError:
            pass
    content = msg.content or ""
    thinking = (msg.model_extra or {}).get("reasoning_content") or ""
    raw = {"reasoning": thinking, "content": content, "finish": r.choices[0].finish_reason,
           "tool_calls": [(c.function.name, c.function.arguments) for c in calls]}
    return Reply(call, bool(calls) or "<tool_call>" in content, content, json.dumps(raw)), r.usage.prompt_tokens


def anthropic_reply(client: Any, model: str, conv: Conversation, max_tokens: int) -> tuple[Reply, int]:
    # the SDK (2.x) has no `temperature` argument any more; the server reads it from the body
    r = client.messages.create(model=model, max_tokens=max_tokens, extra_body={"temperature": 0},
                               **anthropic_kwargs(conv))
    uses = [b for b in r.content if b.type == "tool_use"]
    text = "".join(b.text for b in r.content if b.type == "text")
    thinking = "".join(b.thinking for b in r.content if b.type == "thinking")
    call = (uses[0].name, dict(uses[0].input)) if uses and isinstance(uses[0].input, dict) else None
    raw = {"thinking": thinking, "text": text, "stop": r.stop_reason,
           "tool_use": [(b.name, b.input) for b in uses]}
    u = r.usage  # input_tokens leaves out the prompt tokens the prefix cache held
    prompt = u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
    return Reply(call, bool(uses) or "<tool_call>" in text, text, json.dumps(raw)), prompt


# ---- the server, with the engine's prompts recorded -----------------------------------------------------------
class PromptRecorder:
    """The real engine, with the prompt ids of every request it is given kept (in arrival order)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.prompts: list[tuple[int, ...]] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, prompt_token_ids: list[int], params: Any, request_id: str | None = None,
                       ) -> AsyncIterator[Any]:
        with self._lock:
            self.prompts.append(tuple(prompt_token_ids))
        async for out in self._engine.generate(prompt_token_ids, params, request_id):
            yield out


@contextmanager
def local_server(model: Path, device: str, max_running: int) -> Iterator[tuple[str, list[PromptRecorder]]]:
    """`ft serve`'s app on a free loopback port serving `model`; yields (url, [recorder]) (the list gets the
    recorder once the engine is built on the server's loop)."""
    from freetoken.bench.loopback import serve
    from freetoken.config import EngineConfig
    from freetoken.engine.async_llm import AsyncLLM
    from freetoken.server.settings import ServerConfig

    cfg = EngineConfig(model=str(model), device=device, max_running_requests=max_running)
    made: list[PromptRecorder] = []

    def factory() -> PromptRecorder:
        made.append(PromptRecorder(AsyncLLM.start(cfg)))
        return made[-1]

    with serve(factory, ServerConfig(served_model_names=(MODEL_ALIAS,))) as running:
        yield running.url, made


def sdk_clients(url: str, timeout_s: float) -> tuple[Any, Any]:
    import anthropic
    import openai

    return (openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=timeout_s),
            anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=timeout_s))


def http_answerer(api: str, client: Any, model: str, tok: Any, concurrency: int,
                  recorded: Callable[[], list[tuple[int, ...]]] | None) -> Answerer:
    """Sends a set's prompts through one API, `concurrency` at a time; after the set prints how the server's
    prompts compare with evaluate.py's (token for token when `recorded` gives the engine's prompt ids, else the
    counts the server reports) and the requests that failed (each scored as a miss, the error as its reply)."""
    send = openai_reply if api == "openai" else anthropic_reply
    render, count = renderer(tok)

    def one(conv: Conversation, max_new: int) -> tuple[Reply, int]:
        try:
            return send(client, model, conv, max_new)
        except Exception as exc:  # a refused or failed request scores as a miss; the run goes on
            return Reply(None, False, "", f"error: {type(exc).__name__}: {exc}"), -1

    def answer(prompts: Prompts, max_new: int) -> list[Reply]:
        before = len(recorded()) if recorded else 0
        with ThreadPoolExecutor(concurrency) as pool:
            got = list(pool.map(lambda p: one(p[0], max_new), prompts))
        counts_ok = sum(n == count(text) for (_, text), (_, n) in zip(prompts, got))
        line = f"[eval {api}] prompts: server's token count == evaluate.py's for {counts_ok}/{len(prompts)}"
        errors = [r.raw for r, n in got if n < 0]
        if errors:
            line += f"; {len(errors)} requests failed (scored as misses), the first: {errors[0]}"
        if recorded:
            line += "; " + compare_prompts(prompts, recorded()[before:], tok, render)
        print(line, flush=True)
        return [r for r, _ in got]

    return answer


def compare_prompts(prompts: Prompts, server: list[tuple[int, ...]], tok: Any,
                    render: Callable[[Conversation], str]) -> str:
    """How many of the server's prompts equal evaluate.py's token for token: as drawn, or with the tools in the
    server's key order (the one expected difference)."""
    def ids(text: str) -> tuple[int, ...]:
        return tuple(tok(text, add_special_tokens=False)["input_ids"])

    seen = set(server)
    same = sum(ids(text) in seen for _, text in prompts)
    reordered = [c for c, text in prompts if ids(text) not in seen and render(server_shaped(c)) != text]
    same_reordered = sum(ids(render(server_shaped(c))) in seen for c in reordered)
    return (f"equal to evaluate.py's token for token {same}/{len(prompts)}, with the tools in the server's key "
            f"order {same_reordered}/{len(reordered)} more; differing {len(prompts) - same - same_reordered}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="the checkpoint (its tokenizer draws the sets)")
    p.add_argument("--url", default=None, help="a running ft serve (default: serve --model here)")
    p.add_argument("--api", choices=["openai", "anthropic", "both"], default="both")
    p.add_argument("--device", default="cpu")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight per API")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per request")
    add_set_args(p)
    a = p.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model)
    with (local_server(a.model, a.device, a.concurrency) if a.url is None else _running(a.url)) as (url, made):
        oa, an = sdk_clients(url, a.timeout)
        model = oa.models.list().data[0].id
        recorded = (lambda: made[0].prompts) if made else None
        apis = ["openai", "anthropic"] if a.api == "both" else [a.api]
        answerers = {api: http_answerer(api, oa if api == "openai" else an, model, tok, a.concurrency, recorded)
                     for api in apis}
        evaluate(answerers, tok, a.n_tool, a.n_arith, a.n_none, a.min_tokens, a.max_tokens, a.show_misses)


@contextmanager
def _running(url: str) -> Iterator[tuple[str, list[PromptRecorder]]]:
    yield url.rstrip("/"), []


if __name__ == "__main__":
    main()
