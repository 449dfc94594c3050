"""Synthetic filler prose for long agent prompts: instructions, usage notes and environment blocks.

Every sentence is assembled here from small word pools (written for this project), so the long
system prompts look like a coding agent's without copying any client's text. The content carries
no answer: the model must learn to find the tool list and the user's request around it.
"""

from __future__ import annotations

import random

_SUBJECTS = ["You", "The assistant", "Every reply", "Each tool call", "A good answer", "The agent", "Your output"]
_MODALS = ["must", "should", "may", "must never", "should always", "is expected to", "is allowed to"]
_VERBS = ["keep", "explain", "check", "avoid", "prefer", "follow", "respect", "report", "verify", "mention",
          "summarise", "quote", "include", "reuse", "read", "protect", "test", "list", "describe", "update"]
_OBJECTS = ["the user's code style", "existing conventions in the repository", "short and direct sentences",
            "the project's test suite", "files outside the working directory", "secrets and credentials",
            "commands that change the system", "the exact error message", "relative imports",
            "long explanations when a short one is enough", "changes the user did not ask for",
            "the current branch", "the surrounding code before editing", "unfinished work",
            "the results of every command", "the plan before a large change", "trailing whitespace",
            "network access", "destructive git operations", "the documentation", "markdown formatting",
            "the lint configuration", "comments that repeat the code", "dependencies that are not installed"]
_TAILS = ["", "", " when it helps the user", " unless the user asks otherwise", " before finishing",
          " at every step", " in the final message", " whenever possible", " without being asked",
          " if the task is unclear", " after each edit", " for larger tasks"]
_HEADINGS = ["Tone and style", "Working with code", "Safety", "Doing tasks", "Tool usage policy", "Git",
             "Testing", "Formatting", "Planning", "Communication", "Environment", "Editing files",
             "Following conventions", "Proactiveness", "Task management", "Output limits"]
_NOTE_OPENERS = ["Use this tool to", "This tool lets you", "Call it to", "It is meant to", "Prefer it to",
                 "Do not use it to", "Only use it to", "It can also"]
_NOTE_ACTIONS = ["inspect the repository", "gather context before an edit", "check what changed",
                 "find the right place for a fix", "confirm a hypothesis", "look at configuration",
                 "run several steps at once", "answer questions about the code", "avoid guessing",
                 "read large outputs in parts", "keep the context small", "save time on big searches"]
_NOTE_RULES = ["Results longer than the limit are cut.", "Paths must not contain wildcards here.",
               "The call fails if the target does not exist.", "Output is returned as plain text.",
               "Several calls may run in parallel.", "Arguments are validated against the schema.",
               "Hidden files are skipped unless asked for.", "The working directory is kept between calls.",
               "Errors are returned instead of raised.", "Large binary files are not shown.",
               "Timeouts are given in milliseconds.", "Line numbers start at 1."]
_WORDS = """alpha beta gamma delta build cache client config module service handler parser token stream
buffer record layout widget window router schema report vector matrix kernel queue worker branch commit
""".split()


def sentence(rng: random.Random) -> str:
    return (f"{rng.choice(_SUBJECTS)} {rng.choice(_MODALS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
            f"{rng.choice(_TAILS)}.")


def paragraph(rng: random.Random, n: int) -> str:
    return " ".join(sentence(rng) for _ in range(n))


def instructions(rng: random.Random, chars: int) -> str:
    """Markdown-ish system instructions of about `chars` characters: headings, paragraphs, bullets."""
    parts: list[str] = []
    size = 0
    while size < chars:
        block = f"# {rng.choice(_HEADINGS)}\n" + paragraph(rng, rng.randint(2, 6)) + "\n"
        block += "".join(f"- {sentence(rng)}\n" for _ in range(rng.randint(0, 6)))
        parts.append(block)
        size += len(block)
    return "\n".join(parts)[:max(chars, 1)].rstrip()


def usage_notes(rng: random.Random, chars: int) -> str:
    """A tool description's tail: usage notes and rules, about `chars` characters."""
    out: list[str] = []
    size = 0
    while size < chars:
        s = (f"{rng.choice(_NOTE_OPENERS)} {rng.choice(_NOTE_ACTIONS)}." if rng.random() < 0.5
             else rng.choice(_NOTE_RULES))
        s = f"- {s}" if rng.random() < 0.4 else s
        out.append(s)
        size += len(s) + 1
    return "\n".join(out)


def environment_block(rng: random.Random, cwd: str) -> str:
    """An <env> block like agents put at the end of their system prompt (all values made up)."""
    y, m, d = rng.randint(2024, 2027), rng.randint(1, 12), rng.randint(1, 28)
    lines = [f"Working directory: {cwd}", f"Is directory a git repo: {rng.choice(['yes', 'no'])}",
             f"Platform: {rng.choice(['linux', 'darwin', 'win32'])}", f"Today's date: {y}-{m:02d}-{d:02d}"]
    if rng.random() < 0.5:
        files = " ".join(f"{rng.choice(_WORDS)}_{rng.choice(_WORDS)}.py" for _ in range(rng.randint(2, 8)))
        lines.append(f"Recent files: {files}")
    return "<env>\n" + "\n".join(lines) + "\n</env>"
