"""Output parsers, think-tag and JSON/XML `<tool_call>` families (Qwen3, Qwen3-Coder, Hermes).

Every sample is checked streamed at every split point and one character at a time against the
non-streaming parse (`check`), then the parse itself is asserted.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import parser_harness
from freetoken.chat import (
    ContentDelta,
    ParsedMessage,
    detect_family,
    make_stream_parser,
    parse,
    prompt_opens_reasoning,
)
from parser_harness import calls, counter_ids

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "ratio": {"type": "number"},
                    "opts": {"type": "object"},
                    "tags": {"type": ["array", "null"]},
                },
            },
        },
    },
    {"name": "run_shell", "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
]


check = functools.partial(parser_harness.check, tools=TOOLS)
run = functools.partial(parser_harness.run, tools=TOOLS)


QWEN3 = (
    "<think>\nThe user wants weather for two cities.\n</think>\n\n"
    "Let me check both.\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "東京 <b>", "days": 1}}\n</tool_call>'
)


def test_qwen3_reasoning_content_and_parallel_calls():
    msg = check(QWEN3, "qwen3")
    assert msg.reasoning == "The user wants weather for two cities."
    assert msg.content == "Let me check both."
    assert calls(msg) == [
        ("get_weather", {"city": "Paris", "days": 2}),
        ("get_weather", {"city": "東京 <b>", "days": 1}),
    ]
    assert [c.id for c in msg.tool_calls] == [f"call_{0:024x}", f"call_{1:024x}"]


def test_qwen3_missing_think_opener_when_prompt_opened_it():
    text = QWEN3.removeprefix("<think>\n")
    msg = check(text, "qwen3", sir=True)
    assert msg.reasoning == "The user wants weather for two cities."
    assert len(msg.tool_calls) == 2
    # Without the flag the same text has no opener, so it is all content (the </think> included).
    assert "</think>" in parse(text, "qwen3", TOOLS).content


def test_qwen3_repeated_opener_and_empty_reasoning():
    assert check("<think>\nx\n</think>\nhi", "qwen3", sir=True) == ParsedMessage("hi", "x", [])
    assert check("</think>\n\nhello", "qwen3", sir=True) == ParsedMessage("hello", "", [])


def test_content_after_call_and_text_around():
    text = 'Before.\n<tool_call>\n{"name": "run_shell", "arguments": {"cmd": "ls -la"}}\n</tool_call>\nAfter.'
    msg = check(text, "qwen3")
    assert msg.content == "Before.After."
    assert calls(msg) == [("run_shell", {"cmd": "ls -la"})]


def test_malformed_json_is_content_and_later_calls_still_parse():
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par\n</tool_call>'
    good = '<tool_call>\n{"name": "run_shell", "arguments": "{\\"cmd\\": \\"pwd\\"}"}\n</tool_call>'
    msg = check("Hi\n" + bad + "\n" + good, "qwen3")
    assert msg.content == "Hi\n" + bad
    assert calls(msg) == [("run_shell", {"cmd": "pwd"})]


def test_unclosed_call_is_content_at_finish():
    text = 'Working.\n<tool_call>\n{"name": "run_shell", "arguments": {"cmd": "ls"}}'
    msg = check(text, "qwen3")
    assert msg.content == text and msg.tool_calls == []


def test_unclosed_reasoning_stays_reasoning():
    msg = check("<think>\nstill thinking <tool_c", "qwen3")
    assert msg == ParsedMessage("", "still thinking <tool_c", [])


def test_no_tools_leaves_markup_as_content():
    text = '<tool_call>\n{"name": "run_shell", "arguments": {}}\n</tool_call>'
    for tools in (None, []):
        msg = check("<think>a</think>" + text, "qwen3", tools=tools)
        assert msg == ParsedMessage(text, "a", [])


def test_reasoning_false_hides_reasoning_but_never_leaks_tags():
    msg = check(QWEN3, "qwen3", reasoning=False)
    assert msg.reasoning == "" and msg.content == "Let me check both." and len(msg.tool_calls) == 2


def test_no_family_is_passthrough():
    text = "  <think>x</think> <tool_call>{}</tool_call>\n"
    assert check(text, None) == ParsedMessage(text, "", [])


def test_partial_tag_is_held_and_plain_text_is_not():
    p = make_stream_parser("qwen3", TOOLS, False)
    assert p.feed("Hello world") == [ContentDelta("Hello world")]
    assert p.feed(" <tool_ca") == []  # may still become a tag
    assert p.feed("t> is a tag name") == [ContentDelta(" <tool_cat> is a tag name")]


QWEN3_CODER = (
    "I'll look it up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n"
    '<parameter=ratio>\n0.5\n</parameter>\n<parameter=opts>\n{"a": [1, 2]}\n</parameter>\n'
    "<parameter=tags>\nnull\n</parameter>\n</function>\n</tool_call>\n"
    "<tool_call>\n<function=run_shell>\n<parameter=cmd>\nif [ 1 -lt 2 ]; then\n  echo '<ok>'\nfi\n"
    "</parameter>\n</function>\n</tool_call>"
)


def test_qwen3_coder_xml_typed_by_schema():
    msg = check(QWEN3_CODER, "qwen3_coder")
    assert msg.content == "I'll look it up."
    assert calls(msg) == [
        (
            "get_weather",
            {
                "city": "New York",
                "days": 3,
                "metric": True,
                "ratio": 0.5,
                "opts": {"a": [1, 2]},
                "tags": None,
            },
        ),
        ("run_shell", {"cmd": "if [ 1 -lt 2 ]; then\n  echo '<ok>'\nfi"}),
    ]


def test_qwen3_coder_tolerates_missing_parameter_close_and_keeps_bad_types_as_text():
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n<parameter=days>\nthree\n"
        "</function>\n</tool_call>"
    )
    msg = check(text, "qwen3_coder")
    assert calls(msg) == [("get_weather", {"city": "Rome", "days": "three"})]


def test_qwen3_coder_with_reasoning_started_in_prompt_and_json_body():
    text = (
        'plan it\n</think>\n\n<tool_call>\n{"name": "run_shell", "arguments": {"cmd": "make"}}\n</tool_call>'
    )
    msg = check(text, "qwen3_coder", sir=True)
    assert msg.reasoning == "plan it" and calls(msg) == [("run_shell", {"cmd": "make"})]


def test_qwen3_coder_malformed_body_is_content():
    text = "Hmm\n<tool_call>\n<function=>\n</function>\n</tool_call>"
    assert check(text, "qwen3_coder") == ParsedMessage(text, "", [])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(QWEN3_CODER)), max_size=12))
def test_random_multi_way_splits(cuts):
    cuts = sorted(set(cuts))
    pieces = [QWEN3_CODER[a:b] for a, b in zip([0] + cuts, cuts + [len(QWEN3_CODER)])]
    assert run(pieces, "qwen3_coder") == parse(QWEN3_CODER, "qwen3_coder", TOOLS, id_factory=counter_ids())


@pytest.mark.parametrize(
    ("template", "model_type", "family"),
    [
        ("{{ '<|channel|>' }}", None, "gpt_oss"),
        ("<tool_call>\n<function=...>", "qwen3_moe", "qwen3_coder"),
        ("<tool_call>{{ tool_call | tojson }}</tool_call> <think>", None, "qwen3"),
        ("<tool_call>{{ x }}</tool_call>", None, "hermes"),
        ("<｜tool▁calls▁begin｜>", None, "deepseek_v3"),
        ("<tool_call>{{ name }}<arg_key>", None, "glm45"),
        ("<minimax:tool_call>", None, "minimax_m2"),
        ("<|tool_calls_section_begin|> <think>", None, "kimi_k2"),
        ("{{ messages }}", "glm4_moe", "glm45"),
        ("{{ messages }}", "llama", None),
    ],
)
def test_detect_family(template, model_type, family):
    assert detect_family(model_type, template) == family


def test_prompt_opens_reasoning():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown"):
        make_stream_parser("nope", TOOLS, False)
    with pytest.raises(ValueError, match="unknown"):
        make_stream_parser("qwen3", TOOLS, False, tool_parser="nope")
    # Overriding one half: GLM's tool syntax with no reasoning parser.
    p = make_stream_parser("qwen3", TOOLS, False, tool_parser="glm45", reasoning_parser="none")
    msg = p.parse_all(
        "<think>x</think><tool_call>run_shell<arg_key>cmd</arg_key><arg_value>ls</arg_value></tool_call>"
    )
    assert msg.content == "<think>x</think>" and calls(msg) == [("run_shell", {"cmd": "ls"})]
