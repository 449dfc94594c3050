"""Gemma-4's output markup: the thought channel (``<|channel>thought\\n … <channel|>``) and tool calls
(``<|tool_call>call:NAME{k:<|"|>v<|"|>,…}<tool_call|>``), each sample checked streamed at every split point and one
character at a time against the non-streaming parse (``parser_harness.check``); the family detected from the
template's markup and from ``model_type``."""

from __future__ import annotations

import functools

from freetoken.chat import detect_family
from freetoken.chat.tools.gemma4 import parse_arguments
from parser_harness import calls
from parser_harness import check as _check

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object", "properties": {
        "cmd": {"type": "string"}}}}},
]  # fmt: skip
check = functools.partial(_check, tools=TOOLS)
Q = '<|"|>'


def test_thought_then_call_then_text():
    text = (f"<|channel>thought\nNeed the weather.<channel|>Let me look.<|tool_call>call:get_weather{{city:{Q}Paris, "
            f"France{Q},days:3}}<tool_call|>")  # fmt: skip
    msg = check(text, "gemma4")
    assert msg.reasoning == "Need the weather."
    assert msg.content == "Let me look."
    assert calls(msg) == [("get_weather", {"city": "Paris, France", "days": 3})]


def test_nested_values_quotes_and_parallel_calls():
    text = (f"<|tool_call>call:run_shell{{cmd:{Q}echo \"a}}b\" {{x}}{Q}}}<tool_call|>"
            f"<|tool_call>call:get_weather{{city:{Q}Oslo{Q},opts:{{metric:true,w:[1,2.5,null,{Q}x{Q}]}}}}"
            f"<tool_call|>")  # fmt: skip
    msg = check(text, "gemma4")
    assert msg.content == ""
    weather = {"city": "Oslo", "opts": {"metric": True, "w": [1, 2.5, None, "x"]}}
    assert calls(msg) == [("run_shell", {"cmd": 'echo "a}b" {x}'}), ("get_weather", weather)]


def test_malformed_call_stays_content():
    text = f"<|tool_call>call:get_weather{{city:{Q}Paris}}<tool_call|>"  # unclosed string
    msg = check(text, "gemma4")
    assert msg.tool_calls == [] and msg.content == text
    assert parse_arguments("{a:1} trailing") is None and parse_arguments('{"a": "b", c: [ ]}') == {"a": "b", "c": []}


def test_plain_text_and_no_thought():
    msg = check("Just an answer.", "gemma4")
    assert msg.content == "Just an answer." and msg.reasoning == "" and msg.tool_calls == []


def test_family_detected():
    template = "{{ '<|turn>' + role }}{% if tools %}<|tool_call>{% endif %}"
    assert detect_family(None, template) == "gemma4"
    assert detect_family("gemma4_text", None) == "gemma4" and detect_family("gemma4", "") == "gemma4"


def test_forced_call_grammar_writes_what_the_parser_reads():
    """``tool_choice: required``: the call forced in JSON-argument form, read back by the Gemma-4 parser (with the
    default model's tokenizer the tags are plain text)."""
    from transformers import AutoTokenizer

    from freetoken.chat.grammar import CallTool, Tags, forced_calls
    from freetoken.engine.grammar import GrammarCompiler
    from freetoken.loader.model_setup import default_model_path
    from test_structured_grammar import WEATHER, _follow

    tok = AutoTokenizer.from_pretrained(default_model_path())
    tools = [CallTool("get_weather", WEATHER), CallTool("noop", {"type": "object", "properties": {}})]
    grammar = forced_calls("gemma4", tools, Tags.of(tok), parallel=False)
    text = '<|tool_call>call:get_weather{"city": "Oslo", "days": 2}<tool_call|>'
    assert _follow(GrammarCompiler(tok, 2048, [2, 0]), grammar, tok, text) == (True, True)
    assert calls(check(text, "gemma4")) == [("get_weather", {"city": "Oslo", "days": 2})]


def test_tool_choice_none_scrubs_gemma4_markup():
    from freetoken.server.scrub import markup_tags

    tags = markup_tags("gemma4", "gemma4")
    assert {"<|channel>thought\n", "<channel|>", "<|tool_call>", "<tool_call|>"} <= set(tags)
