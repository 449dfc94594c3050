"""Agent-shaped conversations: a long system prompt with many tools, a multi-turn history with tool results, the
user's request last; the reply calls the one right tool with exact arguments, answers arithmetic, or calls none.

`prompt_tokens` sets the size: about 2.1 characters per token with v1's tokenizer (measured on this prose), split
between the instructions, the tool descriptions and the history.
"""

from __future__ import annotations

import json
import random
from typing import Any

from training.default_model.pools import FILE_STEMS, FILE_TEXTS, PATH_DIRS, random_dir, random_file
from training.default_model.split import is_heldout
from training.default_model.tasks_chat import chat_conversation
from training.default_model.tasks_math import arithmetic_conversation
from training.default_model.tasks_tools import draw_argument
from training.default_model_v2.agent_tools import STYLES, canonical_names, catalogue
from training.default_model_v2.prose import environment_block, instructions, paragraph

Conversation = dict[str, Any]
CHARS_PER_TOKEN = 2.1

ASK: dict[str, list[str]] = {
    "read": ["Read {x}.", "Show me what is in {x}", "Open the file {x}", "What does {x} say?",
             "Print the contents of {x}.", "Can you look at {x} for me?"],
    "list": ["List the files in {x}.", "What files are in {x}?", "Show me the folder {x}", "What is inside {x}?"],
    "glob": ["Find all files matching {x}", "Which files match the pattern {x}?", "Glob {x} for me.",
             "Look for files like {x}"],
    "grep": ["Search the code for {x}.", "Where is {x} used?", "Grep for {x}", "Find occurrences of {x} in the code."],
    "bash": ["Run `{x}`.", "Please run {x} and tell me the output.", "Execute `{x}`", "Can you run `{x}`?"],
    "fetch": ["Fetch {x}", "What is on the page {x}?", "Download {x} and summarise it.", "Open the URL {x}"],
    "weather": ["What's the weather in {x}?", "Is it raining in {x}?", "How warm is it in {x} today?",
                "Check the weather in {x}."],
    "calculator": ["Use the calculator to compute {x}.", "Calculate {x}.", "Evaluate {x}.", "compute {x}"],
}
WHAT = {"read": "read the file", "list": "list the directory", "glob": "find files matching", "grep": "search for",
        "bash": "run the command", "fetch": "fetch the page", "weather": "get the weather in",
        "calculator": "compute"}
MISSING = {"weather": "check the weather", "fetch": "fetch web pages", "calculator": "use a calculator"}
_IDENT = ["parse", "load", "config", "handler", "token", "cache", "route", "user", "session", "render", "build",
          "queue", "worker", "client", "buffer", "schema", "index", "retry", "limit", "stream"]
_DOMAINS = ["example.com", "docs.example.org", "api.test.dev", "wiki.local", "blog.sample.net", "status.acme.io"]
_CMDS = ["git status", "git log -n {k}", "ls -la {d}", "pytest -q {f}", "python3 {f}", "wc -l {f}", "make {w}",
         "npm run {w}", "cat {f}", "du -sh {d}", "head -n {k} {f}", "cargo test {w}"]


def _identifier(rng: random.Random) -> str:
    a, b = rng.choice(_IDENT), rng.choice(_IDENT)
    form = rng.randrange(3)
    return f"{a}_{b}" if form == 0 else f"{a}{b.capitalize()}" if form == 1 else f"{a.capitalize()}{b.capitalize()}"


def _raw_argument(rng: random.Random, kind: str) -> str:
    if kind == "read":
        return random_file(rng)
    if kind == "list":
        return random_dir(rng)
    if kind == "glob":
        return rng.choice([f"**/*.{rng.choice(['py', 'ts', 'md', 'json', 'rs', 'go'])}",
                           f"{rng.choice(PATH_DIRS)}/**/*.{rng.choice(['py', 'ts', 'yaml', 'toml'])}",
                           f"{rng.choice(PATH_DIRS)}/{rng.choice(FILE_STEMS)}_*.{rng.choice(['py', 'txt', 'log'])}"])
    if kind == "grep":
        return _identifier(rng)
    if kind == "bash":
        return rng.choice(_CMDS).format(k=rng.randint(1, 50), d=random_dir(rng), f=random_file(rng),
                                        w=rng.choice(_IDENT))
    parts = "/".join(rng.choice(PATH_DIRS) for _ in range(rng.randint(1, 3)))
    return f"https://{rng.choice(_DOMAINS)}/{parts}"


def argument(rng: random.Random, kind: str, heldout: bool) -> tuple[str, Any]:
    """(argument, tool result) on the requested side of the split (v1's keys for cities and expressions)."""
    if kind in ("weather", "calculator"):
        return draw_argument(rng, kind, heldout)
    while True:
        x = _raw_argument(rng, kind)
        if is_heldout("path", x) == heldout:
            return x, _result(rng, kind, x)


def _result(rng: random.Random, kind: str, x: str) -> Any:
    if kind == "read":
        return rng.choice(FILE_TEXTS)
    if kind == "list":
        return "\n".join(sorted({f"{rng.choice(FILE_STEMS)}.{rng.choice(['py', 'md', 'txt'])}"
                                 for _ in range(rng.randint(1, 5))}))
    if kind in ("glob", "grep"):
        return "\n".join(random_file(rng) for _ in range(rng.randint(1, 4)))
    if kind == "bash":
        return rng.choice(FILE_TEXTS)
    return paragraph(rng, 2)


def _answer(kind: str, x: str, result: Any) -> str:
    if kind == "weather":
        return f"It is {result['temperature']} degrees Celsius and {result['condition']} in {x}."
    if kind == "calculator":
        return f"{x} = {result['result']}."
    first = str(result).split("\n")[0]
    return {"read": f"{x} says: {first}", "list": f"{x} contains {first} and more." if "\n" in str(result)
            else f"{x} contains {first}.", "bash": f"`{x}` printed: {first}",
            "fetch": f"The page says: {first}"}.get(kind, f"Found {first} first.")


def _history(rng: random.Random, offered: dict[str, tuple[str, str]], chars: int, heldout: bool,
             ) -> list[dict[str, Any]]:
    """Earlier turns: requests answered with a call of the right offered tool (trainable: `_train`, see
    agent_data.agent_pieces), its result (the bulk of the history's length) and a short answer; now and then a
    plain exchange. They come before the last user query, so the template renders them without thinking."""
    msgs: list[dict[str, Any]] = []
    turns = rng.randint(1, 8)
    left, kinds = chars, sorted(offered)
    for t in range(turns if chars > 0 else 0):
        if not kinds or rng.random() < 0.15:
            msgs += [{"role": "user", "content": paragraph(rng, rng.randint(1, 3))},
                     {"role": "assistant", "content": paragraph(rng, rng.randint(1, 2))}]
            left -= 400
            continue
        kind = rng.choice(kinds)
        name, param = offered[kind]
        x, result = argument(rng, kind, heldout)
        text = result if isinstance(result, str) else json.dumps(result)
        if kind not in ("weather", "calculator"):  # a long file, listing or command output fills the prompt
            lines, want = [], left // (turns - t) - 300
            while want > 0:
                lines.append(f"{len(lines) + 1}\t{paragraph(rng, 1)}")
                want -= len(lines[-1]) + 1
            text = "\n".join([text, *lines])
        call = {"type": "function", "function": {"name": name, "arguments": {param: x}}}
        msgs += [{"role": "user", "content": rng.choice(ASK[kind]).format(x=x)},
                 {"role": "assistant", "content": "", "tool_calls": [call], "_train": True},
                 {"role": "tool", "content": text},
                 {"role": "assistant", "content": _answer(kind, x, result)}]
        left -= len(text) + 300
    return msgs


def _reminder(rng: random.Random) -> str:
    return f"<system-reminder>\n{paragraph(rng, rng.randint(1, 4))}\n</system-reminder>\n" if rng.random() < 0.3 else ""


def agent_conversation(rng: random.Random, prompt_tokens: int, task: str, heldout: bool = False,
                       with_result: bool = True) -> Conversation:
    """task: "tool" (a needed tool is offered), "missing" (the needed kind is not offered), "arith", "chat"."""
    style = rng.choice(STYLES)
    chars = int(prompt_tokens * CHARS_PER_TOKEN)
    kind = rng.choice(sorted(ASK)) if task == "tool" else rng.choice(sorted(MISSING))
    n_tools = rng.randint(4, 12) + chars // 6000
    tool_chars = int(chars * rng.uniform(0.35, 0.6))
    tools, name, param, offered = catalogue(rng, style, kind if task == "tool" else None, n_tools,
                                   tool_chars // max(1, n_tools), heldout, exclude=(kind,) if task == "missing" else ())
    cwd = random_dir(rng)
    system = instructions(rng, int(chars * rng.uniform(0.2, 0.4))) + "\n\n" + environment_block(rng, cwd)
    hist_chars = max(0, chars - tool_chars - len(system))
    msgs: list[dict[str, Any]] = [{"role": "system", "content": system}]
    if task == "tool" and (heldout or rng.random() < 0.5):  # held out: the history never calls the needed tool
        offered = {k: v for k, v in offered.items() if k != kind}
    msgs += _history(rng, offered, hist_chars, heldout) if rng.random() < 0.85 else []
    meta: dict[str, Any] = {"task": task, "style": style, "kind": kind, "prompt_tokens": prompt_tokens}
    if task == "tool":
        x, result = argument(rng, kind, heldout)
        msgs.append({"role": "user", "content": _reminder(rng) + rng.choice(ASK[kind]).format(x=x)})
        call = {"type": "function", "function": {"name": name, "arguments": {param: x}}}
        reason = f"The user wants to {WHAT[kind]} {x}. {name} does that, so I call it with {param} {x}."
        msgs.append({"role": "assistant", "content": "", "reasoning_content": reason, "tool_calls": [call]})
        if with_result:
            msgs.append({"role": "tool", "content": result if isinstance(result, str) else json.dumps(result)})
            msgs.append({"role": "assistant", "content": _answer(kind, x, result),
                         "reasoning_content": f"{name} returned the result."})
        meta |= {"name": name, "arguments": {param: x}, "seen_name": name in canonical_names()}
    elif task == "missing":
        x, _ = argument(rng, kind, heldout)
        msgs.append({"role": "user", "content": _reminder(rng) + rng.choice(ASK[kind]).format(x=x)})
        msgs.append({"role": "assistant", "content": f"Sorry, I have no tool to {MISSING[kind]} here.",
                     "reasoning_content": f"None of the tools can {MISSING[kind]}."})
    else:
        short = arithmetic_conversation(rng, heldout) if task == "arith" else chat_conversation(rng)
        msgs += short["messages"]
        meta |= short["meta"] | {"task": task}
    return {"messages": msgs, "tools": tools, "enable_thinking": True, "meta": meta}
