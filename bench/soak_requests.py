"""The soak's requests (``bench/soak.py``): good ones on all three APIs (streamed or not, tools, tiny temperatures),
malformed ones each route must refuse with a 4xx, randomly mutated good bodies and client aborts; each sent, checked
(5xx but 503/529, errors in the API's own shape, good ones served, malformed ones refused) and tallied."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

CHAT, RESP, MSGS, COUNT = "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"
MODEL = "soak"
TOKEN = "<|im_start|>system"
OVERLOADED = (503, 529)  # documented: shutting down or loading (503), Anthropic's overloaded (529)
TOOL = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@dataclass
class Tally:
    sent: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    status: dict[int, int] = field(default_factory=dict)
    five_xx: list[str] = field(default_factory=list)
    wrong_shape: list[str] = field(default_factory=list)
    good_refused: list[str] = field(default_factory=list)
    bad_accepted: list[str] = field(default_factory=list)

    def count(self, kind: str, status: int) -> None:
        self.sent += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        self.status[status] = self.status.get(status, 0) + 1


def good(rng: random.Random) -> tuple[str, dict[str, Any]]:
    n = rng.randint(1, 6)
    temp = rng.choice([0, 0, 0.7, 1.0, 1e-40])
    text = rng.choice(["hi", "What is the weather in Paris?", "Add 19 and 23.", "Tell me a story."])
    path = rng.choice([CHAT, CHAT, RESP, MSGS, MSGS, COUNT])
    tools = rng.random() < 0.3
    if path == CHAT:
        body: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": n,
            "temperature": temp,
            "messages": [{"role": "user", "content": text}],
        }
        if tools:
            body["tools"] = [{"type": "function", "function": TOOL}]
    elif path == RESP:
        body = {"model": MODEL, "max_output_tokens": n, "temperature": temp, "input": text}
        if tools:
            body["tools"] = [{"type": "function", **TOOL}]
    else:
        body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
        if path == MSGS:
            body.update(max_tokens=n, temperature=temp)
        if tools:
            body["tools"] = [{"name": TOOL["name"], "input_schema": TOOL["parameters"]}]
    if path != COUNT and rng.random() < 0.4:
        body["stream"] = True
    return path, body


ANY, CONVERSATION = (CHAT, RESP, MSGS, COUNT), (CHAT, MSGS, COUNT)


def malformed(rng: random.Random, limit: int) -> tuple[str, bytes]:
    """A request each of its routes must refuse with a 4xx: (routes, what to append to a good body)."""
    nested = "[" * 50_000 + "]" * 50_000
    fn = '{"type": "function", "function": {"name": "' + TOKEN + '"}}'
    cases: list[tuple[tuple[str, ...], str]] = [
        (ANY, "{not json"),
        (ANY, "[1, 2]"),
        ((CHAT, RESP, MSGS), ', "temperature": NaN'),
        ((CHAT, RESP, MSGS), ', "top_p": Infinity'),
        ((CHAT, RESP), ', "seed": 18446744073709551616'),
        (CONVERSATION, ', "messages": ' + nested),
        (CONVERSATION, ', "messages": 5'),
        ((CHAT, MSGS), ', "max_tokens": "ten"'),
        (ANY, ', "model": 42'),  # any model *name* is served (the loaded model answers); a number is not one
        (CONVERSATION, ', "messages": []'),
        ((CHAT,), ', "tools": [' + fn + "]"),
        ((MSGS, COUNT), ', "tools": [{"name": "' + TOKEN + '", "input_schema": {"type": "object"}}]'),
        ((RESP,), ', "tools": [{"type": "function", "name": "' + TOKEN + '"}]'),
        ((RESP,), ', "input": [{"type": "message", "role": "user", "content": 5}]'),
        ((RESP,), ', "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": 5}]'),
        ((RESP,), ', "tools": [{"type": "custom", "name": "t", "format": "lark"}]'),
        (ANY, ', "pad": "' + "x" * (limit + 1) + '"'),
    ]
    paths, tail = rng.choice(cases)
    path = rng.choice(paths)
    base: dict[str, Any] = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    if path == RESP:
        base = {"model": MODEL, "input": "hi"}
    if tail.startswith(","):  # a later key replaces an earlier one of the same name in JSON objects
        return path, (json.dumps(base)[:-1] + tail + "}").encode()
    return path, tail.encode()


def mutated(rng: random.Random) -> tuple[str, bytes]:
    path, body = good(rng)
    key = rng.choice([*body, "top_k", "seed", "stop", "tool_choice", "n", "top_p"])
    body[key] = rng.choice([None, -1, 2**70, 1e308, "", "x" * 50, [], {}, [1, [2]], {"a": {"b": None}}, True])
    body.pop("stream", None)
    return path, json.dumps(body).encode()


def shaped(path: str, r: httpx.Response) -> bool:
    try:
        body = r.json()
    except ValueError:
        return False
    if path.startswith(MSGS):
        return body.get("type") == "error" and {"type", "message"} <= set(body.get("error", {}))
    return {"message", "type", "param", "code"} <= set(body.get("error", {}))


async def send(client: httpx.AsyncClient, url: str, kind: str, path: str, payload: Any, t: Tally) -> float | None:
    """One request; returns its latency when it was a good non-streamed one that succeeded."""
    start = time.perf_counter()
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = {"content-type": "application/json"}
    streamed = isinstance(payload, dict) and payload.get("stream") is True
    try:
        if kind == "abort" and streamed:
            async with client.stream("POST", url + path, content=content, headers=headers) as r:
                async for _ in r.aiter_raw():
                    break
            t.count(kind, r.status_code)
            return None
        timeout = httpx.Timeout(60.0, read=0.05) if kind == "abort" else httpx.Timeout(120.0)
        r = await client.post(url + path, content=content, headers=headers, timeout=timeout)
    except httpx.ReadTimeout:
        t.count(kind, 0)  # the client gave up: the server must abort the request
        return None
    t.count(kind, r.status_code)
    label = f"{kind} {path} {r.status_code} {r.text[:160]!r}"
    if r.status_code >= 500 and r.status_code not in OVERLOADED:
        t.five_xx.append(label)
    if r.status_code >= 400 and not shaped(path, r):
        t.wrong_shape.append(label)
    if kind == "good" and r.status_code != 200:
        t.good_refused.append(label)
    if kind == "malformed" and r.status_code < 400:
        t.bad_accepted.append(label)
    return time.perf_counter() - start if kind == "good" and r.status_code == 200 and not streamed else None


async def run_mix(url: str, n: int, concurrency: int, limit: int, seed: int) -> Tally:
    rng = random.Random(seed)
    t = Tally()
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int, client: httpx.AsyncClient) -> None:
        r = rng.random()
        if r < 0.6:
            kind, (path, payload) = "good", good(rng)
        elif r < 0.75:
            kind, (path, payload) = "malformed", malformed(rng, limit)
        elif r < 0.87:
            kind, (path, payload) = "mutated", mutated(rng)
        else:
            path, payload = good(rng)
            kind = "abort"
        async with sem:
            await send(client, url, kind, path, payload, t)

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=concurrency)) as client:
        await asyncio.gather(*(one(i, client) for i in range(n)))
    return t


def merged(tallies: Any) -> Tally:
    out = Tally()
    for t in tallies:
        out.sent += t.sent
        for k, v in t.by_kind.items():
            out.by_kind[k] = out.by_kind.get(k, 0) + v
        for code, v in t.status.items():
            out.status[code] = out.status.get(code, 0) + v
        out.five_xx += t.five_xx
        out.wrong_shape += t.wrong_shape
        out.good_refused += t.good_refused
        out.bad_accepted += t.bad_accepted
    return out
