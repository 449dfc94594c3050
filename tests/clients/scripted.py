"""The scripted model behind the real server in the client tests: it plays one agent turn of the task
"read numbers.txt and answer with the number in it", or of "create hello.py that prints hi" where the prompt asks
for hello.py (``harness.HELLO_PROMPT``).

It reads the rendered prompt (the Qwen-like template of ``scripted_engine``): when the last turn holds a tool
result, it answers with the 5-digit number found there (so the answer can only be right if the client ran the
tool and sent its output back), or says hello.py is written; when the prompt offers a file-reading tool, it calls it
on ``numbers.txt`` with the arguments that client's tool takes (hello.py: its file-writing tool, Codex's shell);
with no tools (title or summary requests) it says a few words.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from scripted_engine import ScriptedEngine, build_tokenizer

NUMBER_RE = re.compile(r"(?<!\d)\d{5}(?!\d)")
# File-reading tools (Claude Code's Read, opencode's and OpenClaw's read, Hermes' read_file) and the path
# parameter each takes; else Codex's shell tools, which take a command.
READ_TOOLS = ("Read", "read", "read_file")
PATH_KEYS = ("file_path", "filePath", "path")
SHELL_CALLS: tuple[tuple[str, Callable[[str], dict[str, Any]]], ...] = (
    ("exec_command", lambda d: {"cmd": "cat numbers.txt", "workdir": d}),  # unified exec
    ("shell", lambda d: {"command": ["cat", "numbers.txt"], "workdir": d}),  # classic shell
)
# File-writing tools (Claude Code's Write, opencode's write, OpenClaw's write, Hermes' write_file) and their path key.
WRITE_TOOLS = (("Write", "file_path"), ("write", "filePath"), ("write", "path"), ("write_file", "path"))
HELLO_ASK = "Create a file hello.py"  # the task's words in the user's turn
HELLO_SOURCE = 'print("hi")\n'
HELLO_SHELL = "printf 'print(\"hi\")\\n' > hello.py"
MAX_MODEL_LEN = 1 << 20  # the toy tokenizer spends ~2x the real one's tokens; no limit worth meeting here


def tools(prompt: str) -> dict[str, set[str]]:
    """Tool name -> its parameters' names, from the rendered prompt's ``<tools>`` block (JSON objects, one
    after another)."""
    block = prompt.split("<tools>", 1)[1].split("</tools>", 1)[0] if "<tools>" in prompt else ""
    decoder, found, at = json.JSONDecoder(), {}, 0
    while (at := block.find("{", at)) >= 0:
        try:
            tool, at = decoder.raw_decode(block, at)
        except ValueError:
            break
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            props = (fn.get("parameters") or {}).get("properties") or {}
            found[fn["name"]] = set(props) if isinstance(props, dict) else set()
    return found


def tool_call(offered: dict[str, set[str]], workdir: str) -> dict[str, Any] | None:
    for name in READ_TOOLS:
        key = next((k for k in PATH_KEYS if k in offered.get(name, ())), None)
        if key is not None:
            return {"name": name, "arguments": {key: f"{workdir}/numbers.txt"}}
    for name, arguments in SHELL_CALLS:
        if name in offered:
            return {"name": name, "arguments": arguments(workdir)}
    return None


def write_call(offered: dict[str, set[str]], workdir: str) -> dict[str, Any] | None:
    """The call that writes hello.py with the client's own tool (Codex: its shell)."""
    for name, key in WRITE_TOOLS:
        if {key, "content"} <= offered.get(name, set()):
            return {"name": name, "arguments": {key: f"{workdir}/hello.py", "content": HELLO_SOURCE}}
    if "exec_command" in offered:
        return {"name": "exec_command", "arguments": {"cmd": HELLO_SHELL, "workdir": workdir}}
    if "shell" in offered:
        return {"name": "shell", "arguments": {"command": ["bash", "-c", HELLO_SHELL], "workdir": workdir}}
    return None


def reply(prompt: str, workdir: str) -> str:
    # Everything since the previous assistant turn (the whole prompt on the first turn).
    last = prompt.rsplit("<|im_start|>assistant", 2)[-2]
    hello = HELLO_ASK in prompt
    if "<tool_response>" in last and hello:
        return "hello.py is written: `python3 hello.py` prints hi."
    if "<tool_response>" in last:
        result = last.rsplit("<tool_response>", 1)[1]
        # Codex's exec tools put their own numbers first (chunk and session ids, a 5-digit one among them at
        # times): the command's output follows "Output:"
        found = NUMBER_RE.findall(result.rsplit("Output:", 1)[-1])
        return f"The number is {found[0]}." if found else "The tool result holds no number."
    offered = tools(prompt)
    call = write_call(offered, workdir) if hello else tool_call(offered, workdir)
    if call is not None:
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    return "Reading a number." if not offered else f"No file-reading tool among: {', '.join(offered)}."


class AgentEngine(ScriptedEngine):
    """The scripted engine playing the agent's model; ``workdir`` is the client's work folder (set per run)."""

    workdir = "."


def engine(tokenizer_dir: str, max_model_len: int = MAX_MODEL_LEN) -> AgentEngine:
    tok = build_tokenizer(tokenizer_dir)

    def script(ids: list[int]) -> str:
        return reply(tok.decode(ids, skip_special_tokens=False), eng.workdir)

    eng = AgentEngine(tok, script, max_model_len=max_model_len, step_s=0.0005, model_name="freetoken")
    return eng
