"""A scripted coding-agent session (OpenAI chat messages: a long system prompt, tool definitions, one task, then
turns of thinking + a tool call + the tool's output) and the context edits of three agent harnesses:

- ``openclaw``: thinking is dropped from every assistant turn but the last;
- ``opencode``: old tool outputs are replaced by a placeholder once the unprotected ones are worth pruning (a
  protected window of the newest outputs, a minimum to prune; OpenCode's compaction, scaled to this session);
- ``swe-agent``: only the last ``n`` observations (tool outputs) are kept, older ones become a one-line note.

Deterministic (seeded): the same session every run."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

_TOOLS = {
    "read_file": ("Read a file of the repository and return its contents with line numbers. Use it before editing "
                  "a file; large files are truncated at 2000 lines.", {"path": "string", "offset": "integer"}),
    "edit_file": ("Replace an exact string in a file with a new string. The old string must occur exactly once; "
                  "include enough surrounding context to make it unique.",
                  {"path": "string", "old_string": "string", "new_string": "string"}),
    "run_command": ("Run a shell command in the repository root and return its standard output and error. Commands "
                    "time out after 120 seconds; do not start servers.", {"command": "string", "timeout": "integer"}),
    "search": ("Search the repository for a regular expression and return matching lines with their file names and "
               "line numbers.", {"pattern": "string", "path": "string"}),
    "list_dir": ("List the files and folders under a directory, one per line, folders ending with a slash.",
                 {"path": "string"}),
}  # fmt: skip

_SYSTEM_RULES = [
    "You are a coding agent working in a git repository on the user's machine.",
    "Read the relevant code before you change it, and keep changes small and focused on the task.",
    "Run the tests that exercise the code you changed, and report their results honestly.",
    "Never commit secrets, never run destructive commands, and ask before deleting files.",
    "Prefer the project's existing helpers over new ones; follow its style guide and naming.",
    "When a command fails, read the error, form a hypothesis, and test it before trying something else.",
    "Explain what you did in a short final message: the files changed, the tests run, what is left.",
]

_WORDS = ("the parser returns a token list and the cache keeps the pages of each prefix so that a request "
          "resumes where the last one stopped while the scheduler admits new work when pages are free and the "
          "tests check that every page is owned exactly once after each step of the engine loop").split()  # fmt: skip
_FILES = ["src/app/cache.py", "src/app/scheduler.py", "src/app/parser.py", "tests/test_cache.py", "src/app/server.py"]


@dataclass(frozen=True)
class Turn:
    assistant: Message  # reasoning_content, content and one tool call
    tool: Message  # the tool's output


@dataclass(frozen=True)
class Session:
    system: str
    task: str
    tools: list[dict[str, Any]]
    turns: list[Turn]
    scale: float = 1.0  # of the lengths (the harnesses' thresholds follow it)

    def texts(self) -> list[str]:
        """Every text of the session (to train a tokenizer on)."""
        out = [self.system, self.task, json.dumps(self.tools)]
        for t in self.turns:
            a = t.assistant
            out += [a["reasoning_content"], a["content"], json.dumps(a["tool_calls"]), t.tool["content"]]
        return out

    def history(self, k: int) -> list[Message]:
        """The messages of request k (0-based): system, task and the first k turns."""
        msgs: list[Message] = [{"role": "system", "content": self.system}, {"role": "user", "content": self.task}]
        for t in self.turns[:k]:
            msgs += [dict(t.assistant), dict(t.tool)]
        return msgs


def _sentence(r: random.Random, n: int) -> str:
    return " ".join(r.choice(_WORDS) for _ in range(n)).capitalize() + "."


def _code(r: random.Random, lines: int) -> str:
    body = []
    for i in range(lines):
        name = r.choice(["page", "node", "slot", "req", "tokens", "state"])
        body.append(f"{i + 1:4d}  {'    ' * r.randint(0, 2)}{name} = {r.choice(['self.', ''])}{r.choice(_WORDS)}"
                    f"_{name}({r.choice(['pages', 'n', 'req.id', 'None'])})")  # fmt: skip
    return "\n".join(body)


def build_session(turns: int = 14, seed: int = 0, scale: float = 1.0) -> Session:
    """``turns`` requests' worth of agent work; ``scale`` multiplies the lengths of thinking and tool outputs."""
    r = random.Random(seed)
    tools = [{"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {k: {"type": v, "description": f"the {k.replace('_', ' ')}"}
                                         for k, v in params.items()},
        "required": list(params)[:1]}}} for name, (desc, params) in _TOOLS.items()]  # fmt: skip
    system = "\n".join(_SYSTEM_RULES + [_sentence(r, 18) for _ in range(int(24 * scale))])
    task = "The prefix cache leaks pages when a request is aborted during prefill. Find the cause and fix it."
    out = []
    for i in range(turns):
        name = list(_TOOLS)[i % len(_TOOLS)] if i else "list_dir"
        path = _FILES[i % len(_FILES)]
        args = {"path": path} if name != "run_command" else {"command": f"python -m pytest -q {path}"}
        think = " ".join(_sentence(r, r.randint(8, 20)) for _ in range(max(1, int(r.randint(3, 8) * scale))))
        call = {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        assistant = {"role": "assistant", "content": f"Step {i + 1}: {_sentence(r, 6)}",
                     "reasoning_content": think, "tool_calls": [call]}  # fmt: skip
        output = _code(r, max(2, int(r.randint(6, 40) * scale)))
        out.append(Turn(assistant, {"role": "tool", "tool_call_id": f"call_{i}", "content": output}))
    return Session(system, task, tools, out, scale)


# ---- the harnesses' edits: the messages each sends for request k ------------------------------------------------
def openclaw(session: Session) -> Callable[[int], list[Message]]:
    def messages(k: int) -> list[Message]:
        msgs = session.history(k)
        last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=-1)
        return [{kk: v for kk, v in m.items() if kk != "reasoning_content"}
                if m["role"] == "assistant" and i != last else m for i, m in enumerate(msgs)]  # fmt: skip

    return messages


OPENCODE_PLACEHOLDER = "[Old tool result content cleared]"


def opencode(session: Session, protect: int = 600, minimum: int = 300) -> Callable[[int], list[Message]]:
    """Tokens estimated as characters / 4, as OpenCode does (``protect`` and ``minimum`` times the session's
    scale); a pruned output stays pruned."""
    pruned: set[int] = set()  # turn indices
    protect, minimum = int(protect * session.scale), int(minimum * session.scale)

    def messages(k: int) -> list[Message]:
        seen, prunable = 0, []
        for i in reversed(range(k)):
            if i in pruned:
                break
            size = len(session.turns[i].tool["content"]) // 4
            if seen >= protect:
                prunable.append(i)
            seen += size
        if sum(len(session.turns[i].tool["content"]) // 4 for i in prunable) >= minimum:
            pruned.update(prunable)
        msgs = session.history(k)
        for i in pruned:
            msgs[3 + 2 * i] = {**msgs[3 + 2 * i], "content": OPENCODE_PLACEHOLDER}
        return msgs

    return messages


def swe_agent(session: Session, n: int = 3) -> Callable[[int], list[Message]]:
    def messages(k: int) -> list[Message]:
        msgs = session.history(k)
        for i in range(max(0, k - n)):
            lines = session.turns[i].tool["content"].count("\n") + 1
            msgs[3 + 2 * i] = {**msgs[3 + 2 * i], "content": f"Old environment output: ({lines} lines omitted)"}
        return msgs

    return messages


POLICIES: dict[str, Callable[[Session], Callable[[int], list[Message]]]] = {
    "openclaw": openclaw, "opencode": opencode, "swe-agent": swe_agent,
}  # fmt: skip
