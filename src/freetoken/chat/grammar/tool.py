"""A tool as the grammars see it: its name, its arguments' schema, and a custom tool's input grammar.
Below the grammar writers and every call format (``tools/*.py``), which all take it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from freetoken.chat.grammar.lark import Rules, regex


@dataclass(frozen=True)
class CallTool:
    name: str
    parameters: dict[str, Any]
    """JSON schema of the arguments."""
    input_syntax: str | None = None
    """A custom (free-form) tool's input grammar: "lark" or "regex" (its one argument is ``input``)."""
    input_definition: str = ""

    def arguments_schema(self) -> dict[str, Any]:
        """The schema JSON-bodied formats enforce: a regex input becomes the string's pattern (a Lark
        input cannot be checked inside a JSON string, so it is any string there)."""
        if self.input_syntax != "regex":
            return self.parameters
        prop = {"type": "string", "pattern": f"^(?:{self.input_definition})$"}
        return {"type": "object", "properties": {"input": prop}, "required": ["input"], "additionalProperties": False}

    def raw_input(self, rules: Rules) -> str | None:
        """The input grammar as one Lark part, for formats that write arguments as raw text."""
        if self.input_syntax == "regex":
            return regex(self.input_definition)
        if self.input_syntax == "lark":
            return rules.grammar(self.input_definition)
        return None
