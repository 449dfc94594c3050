"""Synthetic tool catalogues shaped like the ones coding agents send, as FreeToken's server renders them.

Three client styles, each a look-alike written for this project (no client's text is copied):
"anthropic" (PascalCase names such as Read / Bash, `input_schema` with `additionalProperties` and `$schema`),
"codex" (snake_case names, OpenAI function tools) and "opencode" (lowercase names, camelCase parameters). Whatever
the client sends, the server turns each tool into `{"type": "function", "function": {"name", "description",
"parameters"}}` (`server.internal.ToolSpec.template_dict`), so that is the shape rendered here.

Besides each style's own names, names are composed per sample from verbs and nouns (read_text, ViewFile,
fs_open_document, mcp__docs__fetch_page, ...); a share of the composed names is held out (`split.is_heldout("tool",
name)`), so evaluation offers tool names training never showed.
"""

from __future__ import annotations

import random
from typing import Any

from training.default_model.split import is_heldout
from training.default_model_v2.prose import usage_notes

Tool = dict[str, Any]
STYLES = ("anthropic", "codex", "opencode")

# Kinds a request can need: the canonical name per style, verbs/nouns for composed names, the one required
# parameter's name per style (plus variants), and the first sentence of the description (what the tool does).
NEEDED: dict[str, dict[str, Any]] = {
    "read": {"style": {"anthropic": "Read", "codex": "read_file", "opencode": "read"},
             "verbs": ["read", "view", "open", "cat", "load", "show"],
             "nouns": ["file", "text", "contents", "document"],
             "param": {"anthropic": "file_path", "codex": "path", "opencode": "filePath"},
             "params": ["path", "file_path", "filename", "file"],
             "what": ["Reads a file from the local filesystem and returns its text.",
                      "Returns the contents of one file.", "Opens a text file and shows what it contains."]},
    "list": {"style": {"anthropic": "LS", "codex": "list_dir", "opencode": "list"},
             "verbs": ["list", "ls", "show", "browse"], "nouns": ["dir", "directory", "folder", "files", "entries"],
             "param": {"anthropic": "path", "codex": "path", "opencode": "path"},
             "params": ["path", "directory", "dir", "folder"],
             "what": ["Lists the files and folders in a directory.", "Shows the entries of one directory.",
                      "Returns the names of the files inside a folder."]},
    "glob": {"style": {"anthropic": "Glob", "codex": "file_search", "opencode": "glob"},
             "verbs": ["glob", "find", "match", "locate"], "nouns": ["files", "paths", "names"],
             "param": {"anthropic": "pattern", "codex": "pattern", "opencode": "pattern"},
             "params": ["pattern", "glob", "query"],
             "what": ["Finds files whose paths match a glob pattern.", "Fast file name matching with glob patterns.",
                      "Returns the paths that match a wildcard pattern."]},
    "grep": {"style": {"anthropic": "Grep", "codex": "grep_files", "opencode": "grep"},
             "verbs": ["grep", "search", "scan", "lookup"], "nouns": ["code", "text", "content", "source"],
             "param": {"anthropic": "pattern", "codex": "pattern", "opencode": "pattern"},
             "params": ["pattern", "regex", "query", "needle"],
             "what": ["Searches the contents of files for a regular expression.",
                      "Finds lines in the code base that contain a pattern.",
                      "Full-text search over the files of the project."]},
    "bash": {"style": {"anthropic": "Bash", "codex": "shell", "opencode": "bash"},
             "verbs": ["run", "exec", "execute", "shell"], "nouns": ["command", "shell", "terminal", "bash"],
             "param": {"anthropic": "command", "codex": "command", "opencode": "command"},
             "params": ["command", "cmd", "script"],
             "what": ["Runs a shell command and returns its output.", "Executes a command in a terminal session.",
                      "Starts a process in the shell and reports what it printed."]},
    "fetch": {"style": {"anthropic": "WebFetch", "codex": "web_fetch", "opencode": "webfetch"},
              "verbs": ["fetch", "get", "download", "open"], "nouns": ["url", "page", "web", "website"],
              "param": {"anthropic": "url", "codex": "url", "opencode": "url"},
              "params": ["url", "link", "address"],
              "what": ["Downloads a web page and returns its text.", "Fetches the content of a URL.",
                       "Retrieves a page from the web by its address."]},
    "weather": {"style": {"anthropic": "GetWeather", "codex": "get_weather", "opencode": "weather"},
                "verbs": ["get", "fetch", "check", "lookup"], "nouns": ["weather", "forecast", "conditions"],
                "param": {"anthropic": "city", "codex": "city", "opencode": "city"},
                "params": ["city", "location", "place"],
                "what": ["Returns the current weather for a city.", "Looks up temperature and conditions for a place.",
                         "Gives the weather report of one city."]},
    "calculator": {"style": {"anthropic": "Calculator", "codex": "calculator", "opencode": "calc"},
                   "verbs": ["calc", "compute", "evaluate", "solve"], "nouns": ["math", "expression", "formula"],
                   "param": {"anthropic": "expression", "codex": "expression", "opencode": "expression"},
                   "params": ["expression", "expr", "formula"],
                   "what": ["Evaluates an arithmetic expression exactly.", "A calculator for math expressions.",
                            "Computes the value of a formula."]},
}
# Kinds offered but never needed by our requests (the realistic bulk of an agent's tool list).
DISTRACTORS: dict[str, dict[str, Any]] = {
    "edit": {"style": {"anthropic": "Edit", "codex": "apply_patch", "opencode": "edit"},
             "verbs": ["edit", "patch", "replace", "modify"], "nouns": ["file", "text", "lines"],
             "params": ["old_string", "new_string", "file_path"], "what": ["Replaces text inside a file."]},
    "write": {"style": {"anthropic": "Write", "codex": "write_file", "opencode": "write"},
              "verbs": ["write", "save", "create", "store"], "nouns": ["file", "document", "text"],
              "params": ["content", "file_path"], "what": ["Writes a whole file, replacing what was there."]},
    "todo": {"style": {"anthropic": "TodoWrite", "codex": "update_plan", "opencode": "todowrite"},
             "verbs": ["update", "write", "track", "set"], "nouns": ["todos", "plan", "tasks", "checklist"],
             "params": ["todos", "plan"], "what": ["Keeps a structured list of the steps of the current task."]},
    "task": {"style": {"anthropic": "Task", "codex": "spawn_agent", "opencode": "task"},
             "verbs": ["spawn", "start", "delegate", "launch"], "nouns": ["agent", "task", "worker", "subagent"],
             "params": ["prompt", "description"], "what": ["Starts a helper agent that works on a sub-task alone."]},
    "search": {"style": {"anthropic": "WebSearch", "codex": "web_search", "opencode": "websearch"},
               "verbs": ["search", "query", "find"], "nouns": ["web", "internet", "online"],
               "params": ["query"], "what": ["Searches the web and returns result snippets."]},
    "ask": {"style": {"anthropic": "AskUser", "codex": "request_input", "opencode": "question"},
            "verbs": ["ask", "prompt", "request"], "nouns": ["user", "input", "question"],
            "params": ["question"], "what": ["Asks the user a question and waits for the reply."]},
    "notebook": {"style": {"anthropic": "NotebookEdit", "codex": "edit_notebook", "opencode": "notebook"},
                 "verbs": ["edit", "update", "change"], "nouns": ["notebook", "cell", "ipynb"],
                 "params": ["notebook_path", "cell_id", "new_source"], "what": ["Changes one cell of a notebook."]},
    "email": {"style": {"anthropic": "SendEmail", "codex": "send_email", "opencode": "email"},
              "verbs": ["send", "mail", "post"], "nouns": ["email", "message", "mail"],
              "params": ["to", "subject", "body"], "what": ["Sends an email message."]},
    "time": {"style": {"anthropic": "GetTime", "codex": "get_time", "opencode": "time"},
             "verbs": ["get", "read", "show"], "nouns": ["time", "clock", "date"],
             "params": ["timezone"], "what": ["Returns the current time in a time zone."]},
}
_MCP_SERVERS = ["docs", "tracker", "db", "files", "cloud", "chat", "wiki", "ci", "browser", "memory"]


def canonical_names() -> set[str]:
    """Every style's own tool names: always on the training side."""
    return {n for spec in (*NEEDED.values(), *DISTRACTORS.values()) for n in spec["style"].values()}


_CANONICAL = canonical_names()


def _compose(rng: random.Random, spec: dict[str, Any]) -> str:
    verb, noun = rng.choice(spec["verbs"]), rng.choice(spec["nouns"])
    form = rng.randrange(6)
    if form == 0:
        return f"{verb}_{noun}"
    if form == 1:
        return f"{verb.capitalize()}{noun.capitalize()}"
    if form == 2:
        return f"{verb}{noun.capitalize()}"
    if form == 3:
        return f"{rng.choice(['fs', 'ws', 'dev', 'sys', 'io', 'my'])}_{verb}_{noun}"
    if form == 4:
        return f"mcp__{rng.choice(_MCP_SERVERS)}__{verb}_{noun}"
    return verb if rng.random() < 0.5 else f"{noun}_{verb}"


def tool_name(rng: random.Random, spec: dict[str, Any], style: str, heldout: bool) -> str:
    """The style's own name (40% in training, half of the held-out prompts: what real clients send) or a composed
    name on the requested side of the split (held out: a name training never showed)."""
    if rng.random() < (0.5 if heldout else 0.4):
        return str(spec["style"][style])
    while True:
        name = _compose(rng, spec)
        if name not in _CANONICAL and is_heldout("tool", name) == heldout:
            return name


def _prop(rng: random.Random, pname: str, kind_desc: str) -> dict[str, Any]:
    return {"type": "string", "description": f"The {pname.replace('_', ' ')} to use. {kind_desc}"}


def _schema(rng: random.Random, style: str, required: str, others: list[str]) -> dict[str, Any]:
    props: dict[str, Any] = {required: _prop(rng, required, "Required.")}
    for o in others:
        if o != required and o not in props:
            props[o] = (_prop(rng, o, "Optional.") if rng.random() < 0.6 else
                        {"type": rng.choice(["integer", "number", "boolean"]), "description": f"Optional {o}."})
    keys = list(props)
    if rng.random() < 0.3:  # the required parameter is not always listed first
        rng.shuffle(keys)
    schema: dict[str, Any] = {"type": "object", "properties": {k: props[k] for k in keys}, "required": [required]}
    if style in ("anthropic", "codex"):
        schema["additionalProperties"] = False
    if style == "anthropic" or (style == "opencode" and rng.random() < 0.5):
        schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    return schema


_OPTIONALS = ["limit", "offset", "timeout", "description", "recursive", "max_results", "encoding", "cwd"]


def make_tool(rng: random.Random, kind: str, style: str, heldout: bool, desc_chars: int) -> tuple[Tool, str, str]:
    """One tool in the server's rendered shape; returns (tool, name, required parameter)."""
    spec = NEEDED.get(kind) or DISTRACTORS[kind]
    name = tool_name(rng, spec, style, heldout)
    if kind in NEEDED:
        param = spec["param"][style] if rng.random() < 0.5 else rng.choice(spec["params"])
        others = rng.sample(_OPTIONALS, rng.randint(0, 3))
    else:
        param, others = spec["params"][0], spec["params"][1:] + rng.sample(_OPTIONALS, rng.randint(0, 2))
    desc = rng.choice(spec["what"]) + "\n\n" + usage_notes(rng, desc_chars)
    fn = {"name": name, "description": desc, "parameters": _schema(rng, style, param, others)}
    return {"type": "function", "function": fn}, name, param


def sorted_keys(tool: Tool) -> Tool:
    """The same tool with keys in sorted order (what a plain Jinja `tojson` prints)."""
    if isinstance(tool, dict):
        return {k: sorted_keys(tool[k]) for k in sorted(tool)}
    if isinstance(tool, list):
        return [sorted_keys(x) for x in tool]
    return tool


def catalogue(rng: random.Random, style: str, need: str | None, n_tools: int, desc_chars: int, heldout: bool,
              exclude: tuple[str, ...] = ()) -> tuple[list[Tool], str, str, dict[str, tuple[str, str]]]:
    """n_tools tools in random order, `need` (a NEEDED kind) among them when given; no name appears twice.
    Returns (tools, name, param) of the needed tool ("" when none) and {kind: (name, param)} of the NEEDED kinds
    offered (the first tool of each), for the history's calls."""
    pool = [k for k in NEEDED if k != need and k not in exclude] + list(DISTRACTORS)
    kinds = ([need] if need else []) + [rng.choice(pool) for _ in range(max(0, n_tools - (1 if need else 0)))]
    tools, used, name, param = [], set(), "", ""
    offered: dict[str, tuple[str, str]] = {}
    for i, kind in enumerate(kinds):
        chars = max(40, int(desc_chars * rng.uniform(0.3, 1.7)))
        tool, n, p = make_tool(rng, kind, style, heldout and i == 0, chars)
        for _ in range(8):
            if n not in used:
                break
            tool, n, p = make_tool(rng, kind, style, heldout and i == 0, chars)
        if n in used:
            continue
        used.add(n)
        tools.append(tool)
        if i == 0 and need:
            name, param = n, p
        if kind in NEEDED:
            offered.setdefault(kind, (n, p))
    rng.shuffle(tools)
    if rng.random() < 0.15:
        tools = [sorted_keys(t) for t in tools]
    return tools, name, param, offered
