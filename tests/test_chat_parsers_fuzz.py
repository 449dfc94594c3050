"""Property tests: for random mixtures of every family's markup, streaming in random pieces equals
the non-streaming parse, and nothing raises."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from freetoken.chat import ParsedMessage, accumulate, make_stream_parser, parse

SCHEMA = {"properties": {"x": {"type": "integer"}}}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]

FRAGMENTS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<function=f>", "</function>",
    "<parameter=x>", "</parameter>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    "<minimax:tool_call>", "</minimax:tool_call>", '<invoke name="f">', "</invoke>",
    '<parameter name="x">', "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "function", "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>", "functions.f:0", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
    "<|tool_calls_section_end|>", "<|start|>", "assistant", "<|channel|>", "analysis", "final",
    "commentary to=functions.f", " <|constrain|>json", "<|message|>", "<|end|>", "<|call|>",
    "<|return|>", '{"name": "f", "arguments": {"x": 1}}', '{"x": 2}', "{bad", "\n```json\n", "\n```",
    "f", "1", " ", "\n", "\n\n", "hello", "<", "</", "<|", "｜", "é",
]  # fmt: skip
FAMILIES = [
    "qwen3",
    "qwen3_coder",
    "hermes",
    "gpt_oss",
    "deepseek_v3",
    "glm45",
    "minimax_m2",
    "kimi_k2",
    None,
]


def counter_ids():
    n = itertools.count()
    return lambda: f"call_{next(n)}"


texts = st.lists(st.sampled_from(FRAGMENTS), max_size=24).map("".join)


@settings(max_examples=250, deadline=None)
@given(
    text=texts,
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=10),
    family=st.sampled_from(FAMILIES),
    sir=st.booleans(),
    with_tools=st.booleans(),
)
def test_random_markup_streams_like_parse(text, cuts, family, sir, with_tools):
    tools = TOOLS if with_tools else None
    whole = parse(text, family, tools, sir, id_factory=counter_ids())

    def streamed(pieces: list[str]) -> ParsedMessage:
        p = make_stream_parser(family, tools, sir, id_factory=counter_ids())
        return accumulate([e for piece in pieces for e in p.feed(piece)] + p.finish())

    bounds = sorted({min(c, len(text)) for c in cuts})
    assert streamed([text[a:b] for a, b in zip([0] + bounds, bounds + [len(text)])]) == whole
    for i in range(1, len(text)):
        assert streamed([text[:i], text[i:]]) == whole, f"split at {i}"


@settings(max_examples=200, deadline=None)
@given(text=texts, family=st.sampled_from(["qwen3_coder", "hermes", "glm45", "deepseek_v3", "minimax_m2"]))
def test_without_tools_or_reasoning_the_text_is_the_content(text, family):
    p = make_stream_parser(family, None, False, reasoning_parser="none")
    assert p.parse_all(text) == ParsedMessage(text.strip(), "", [])
