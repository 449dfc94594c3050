"""Tool-use conversations: a varying tool list per request, a Hermes JSON call, the result, an answer.

The tools offered vary per sample (which kinds, their names, descriptions, parameter names and
order), so the model must read the name and the parameter from the request's tool list.
"""

from __future__ import annotations

import json
import random
from typing import Any

from training.default_model.pools import (
    CONDITIONS,
    DISTRACTOR_KINDS,
    FILE_TEXTS,
    REAL_CITIES,
    TOOL_KINDS,
    random_dir,
    random_file,
    random_filename,
    synthetic_cities,
)
from training.default_model.split import is_heldout

Conversation = dict[str, Any]
Tool = dict[str, Any]

CITY_POOL = REAL_CITIES + synthetic_cities(600, seed=1234)
TRAIN_CITIES = [c for c in CITY_POOL if not is_heldout("city", c)]
HELDOUT_CITIES = [c for c in CITY_POOL if is_heldout("city", c)]
_HELDOUT_SET = set(HELDOUT_CITIES)
# Share of training weather questions that name a city drawn fresh for that sample (never a pool name, never on
# the held-out side): with a fixed pool the model memorises names instead of copying the one asked about. Added
# after the committed checkpoint was trained (it copied unseen names right in 1 of 8 held-out weather prompts).
FRESH_CITY_SHARE = 0.5


def fresh_city(rng: random.Random) -> str:
    """A made-up town name for one training sample; never a held-out key."""
    while True:
        name = synthetic_cities(1, seed=rng.getrandbits(32))[0]
        if name not in _HELDOUT_SET and not is_heldout("city", name):
            return name

ASK = {
    "weather": ["What's the weather in {x}?", "weather {x}", "Is it raining in {x}?", "How warm is it in {x} today?",
                "Tell me the weather for {x}.", "What is the weather like in {x}?", "Check the weather in {x}.",
                "how cold is it in {x}"],
    "calculator": ["Use the calculator to compute {x}.", "Calculate {x}.", "What is {x}?", "Evaluate {x}.",
                   "Please work out {x} with the calculator.", "{x} = ?", "compute {x}"],
    "list_files": ["List the files in {x}.", "What files are in {x}?", "Show me the contents of the folder {x}",
                   "ls {x}", "What is inside the directory {x}?", "list {x}"],
    "read_file": ["Read {x}.", "Show me what is in {x}", "Open the file {x}", "cat {x}", "What does {x} say?",
                  "Print the contents of {x}."],
}


def make_tool(rng: random.Random, spec: dict[str, list[str]], client_order: bool) -> tuple[Tool, str, str]:
    """One tool schema with drawn name/description/parameter; returns (tool, name, param).

    client_order: keys in the order OpenAI clients send them; otherwise sorted (what a plain Jinja
    `tojson` prints), so the model sees both renderings.
    """
    name, param = rng.choice(spec["names"]), rng.choice(spec["params"])
    prop = {"description": rng.choice(spec["param_descs"]), "type": "string"}
    if client_order:
        params = {"type": "object", "properties": {param: {"type": "string", "description": prop["description"]}},
                  "required": [param]}
        fn = {"name": name, "description": rng.choice(spec["descs"]), "parameters": params}
        return {"type": "function", "function": fn}, name, param
    params = {"properties": {param: prop}, "required": [param], "type": "object"}
    fn = {"description": rng.choice(spec["descs"]), "name": name, "parameters": params}
    return {"function": fn, "type": "function"}, name, param


def tool_list(rng: random.Random, need: str | None, exclude: tuple[str, ...] = ()) -> tuple[list[Tool], str, str]:
    """1-4 tools in random order; `need` (a TOOL_KINDS key) is among them when given.

    Returns (tools, name, param) of the needed tool ("" when none is needed)."""
    client_order = rng.random() < 0.5
    kinds = [k for k in TOOL_KINDS if k != need and k not in exclude]
    extra = rng.sample(kinds, rng.randint(0, min(2, len(kinds))))
    extra += rng.sample(sorted(DISTRACTOR_KINDS), rng.randint(0 if need or extra else 1, 1))
    tools, name, param = [], "", ""
    used: set[str] = set()
    for kind in ([need] if need else []) + extra:
        spec = TOOL_KINDS.get(kind) or DISTRACTOR_KINDS[kind]
        tool, n, p = make_tool(rng, spec, client_order)
        while n in used:
            tool, n, p = make_tool(rng, spec, client_order)
        used.add(n)
        tools.append(tool)
        if kind == need:
            name, param = n, p
    rng.shuffle(tools)
    return tools, name, param


def _expression(rng: random.Random) -> tuple[str, int]:
    """An expression too big for the in-head column method, with its integer value."""
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 999)
    form = rng.randrange(5)
    if form == 0:
        return f"({a} + {b}) * {c % 50 + 2}", (a + b) * (c % 50 + 2)
    if form == 1:
        return f"{c} * {a}", c * a
    if form == 2:
        return f"{a * b} / {b}", a
    if form == 3:
        return f"{c} * {b} - {a}", c * b - a
    return f"{c} + {a} * {b}", c + a * b


def draw_argument(rng: random.Random, kind: str, heldout: bool) -> tuple[str, Any]:
    """(argument text, tool result payload) on the requested side of the split."""
    payload: dict[str, Any]
    while True:
        if kind == "weather":
            if heldout:
                x = rng.choice(HELDOUT_CITIES)
            else:
                x = fresh_city(rng) if rng.random() < FRESH_CITY_SHARE else rng.choice(TRAIN_CITIES)
            temp = rng.randint(-10, 35)
            return x, {"city": x, "temperature": temp, "unit": "celsius", "condition": rng.choice(CONDITIONS)}
        if kind == "calculator":
            x, value = _expression(rng)
            key, payload = x, {"result": value}
        elif kind == "list_files":
            x = random_dir(rng)
            key, payload = x, {"path": x, "files": sorted({random_filename(rng) for _ in range(rng.randint(0, 4))})}
        else:
            x = random_file(rng)
            key, payload = x, {"path": x, "content": rng.choice(FILE_TEXTS)}
        if is_heldout("expr" if kind == "calculator" else "path", key) == heldout:
            return x, payload


def answer_from_result(kind: str, x: str, payload: dict[str, Any]) -> str:
    if kind == "weather":
        return f"It is {payload['temperature']} degrees Celsius and {payload['condition']} in {x}."
    if kind == "calculator":
        return f"{x} = {payload['result']}."
    if kind == "list_files":
        files = payload["files"]
        return f"{x} contains: {', '.join(files)}." if files else f"{x} is empty."
    return f"{x} contains:\n{payload['content']}"


def tool_conversation(rng: random.Random, heldout: bool = False, think: bool = True,
                      with_result: bool = True) -> Conversation:
    kind = rng.choice(sorted(TOOL_KINDS))
    tools, name, param = tool_list(rng, kind)
    x, payload = draw_argument(rng, kind, heldout)
    user = rng.choice(ASK[kind]).format(x=x)
    call = {"type": "function", "function": {"name": name, "arguments": {param: x}}}
    reason = f"The user asks about {x}. I will call {name} with {param} {x}." if think else ""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": user},
        {"role": "assistant", "content": "", "reasoning_content": reason, "tool_calls": [call]}]
    if with_result:
        messages.append({"role": "tool", "content": json.dumps(payload)})
        messages.append({"role": "assistant", "content": answer_from_result(kind, x, payload),
                         "reasoning_content": f"{name} returned the result." if think else ""})
    return {"messages": messages, "tools": tools, "enable_thinking": think,
            "meta": {"task": "tool", "kind": kind, "name": name, "arguments": {param: x}}}


def missing_tool_conversation(rng: random.Random, heldout: bool = False) -> Conversation:
    """A question for a tool kind that is not offered: say so instead of calling anything."""
    kind = rng.choice(["weather", "list_files", "read_file"])
    tools, _, _ = tool_list(rng, None, exclude=(kind,))
    x, _ = draw_argument(rng, kind, heldout)
    what = {"weather": "check the weather", "list_files": "list files", "read_file": "read files"}[kind]
    return {"messages": [{"role": "user", "content": rng.choice(ASK[kind]).format(x=x)},
                         {"role": "assistant", "content": f"Sorry, I have no tool to {what} here.",
                          "reasoning_content": f"None of the tools can {what}."}],
            "tools": tools, "enable_thinking": True, "meta": {"task": "no_tool", "kind": "missing_" + kind}}
