"""Output parsers: gpt-oss harmony, DeepSeek V3/V3.1/R1, GLM-4.5+, MiniMax-M2.

Same method as test_chat_parsers.py: each sample streamed at every split point and one character
at a time must equal the non-streaming parse, which is then asserted.
"""

from __future__ import annotations

import functools

import parser_harness
from freetoken.chat import ParsedMessage, parse
from parser_harness import calls, counter_ids

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "run_shell", "parameters": {"properties": {"cmd": {"type": "string"}}}},
    },
]


check = functools.partial(parser_harness.check, tools=TOOLS)
run = functools.partial(parser_harness.run, tools=TOOLS)


# ---- gpt-oss harmony ---------------------------------------------------------------------------
HARMONY_CALL = (
    "<|channel|>analysis<|message|>Need weather; call tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "San Francisco", "days": 2}<|call|>'
)
HARMONY_FINAL = (
    "<|channel|>analysis<|message|>Simple sum.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>1 + 1 = **2**.<|return|>"
)


def test_harmony_analysis_and_call():
    msg = check(HARMONY_CALL, "gpt_oss")
    assert msg.reasoning == "Need weather; call tool."
    assert msg.content == ""
    assert calls(msg) == [("get_weather", {"city": "San Francisco", "days": 2})]


def test_harmony_stop_token_cut_off_still_ends_the_call():
    assert check(HARMONY_CALL.removesuffix("<|call|>"), "gpt_oss") == parse(
        HARMONY_CALL, "gpt_oss", TOOLS, id_factory=counter_ids()
    )


def test_harmony_final_channel_is_content():
    for text in (HARMONY_FINAL, HARMONY_FINAL.removesuffix("<|return|>")):
        assert check(text, "gpt_oss") == ParsedMessage("1 + 1 = **2**.", "Simple sum.", [])


def test_harmony_recipient_in_role_preamble_and_parallel_calls():
    text = (
        "<|channel|>commentary<|message|>Checking two things.<|end|>"
        '<|start|>assistant to=functions.run_shell<|channel|>commentary json<|message|>{"cmd": "ls"}<|call|>'
        '<|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>{"city": "Oslo"}<|call|>'
    )
    msg = check(text, "gpt_oss")
    assert msg.content == "Checking two things."
    assert calls(msg) == [("run_shell", {"cmd": "ls"}), ("get_weather", {"city": "Oslo"})]


def test_harmony_malformed_arguments_are_content():
    bad = '<|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>{"city": "Oslo"<|call|>'
    msg = check("<|channel|>analysis<|message|>hm<|end|>" + bad, "gpt_oss")
    assert msg.reasoning == "hm" and msg.tool_calls == []
    assert msg.content == bad


def test_harmony_without_tools_keeps_call_as_content_and_hides_reasoning_on_request():
    msg = check(HARMONY_CALL, "gpt_oss", tools=None, reasoning=False)
    assert msg.reasoning == "" and msg.tool_calls == []
    assert msg.content == HARMONY_CALL.split("<|end|>", 1)[1]


def test_harmony_plain_text_is_content():
    assert check("Just text, no channels.", "gpt_oss") == ParsedMessage("Just text, no channels.", "", [])


# ---- DeepSeek ----------------------------------------------------------------------------------
B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
DS_V31 = (
    "The user asks about weather.</think>I'll check.\n\n"
    f'{B}{CB}get_weather{SEP}{{"city": "Oslo", "days": 1}}{CE}{CB}run_shell{SEP}{{"cmd": "date"}}{CE}{E}'
)


def test_deepseek_v31_thinking_from_prompt_and_parallel_calls():
    msg = check(DS_V31, "deepseek_v3", sir=True)
    assert msg.reasoning == "The user asks about weather."
    assert msg.content == "I'll check."
    assert calls(msg) == [("get_weather", {"city": "Oslo", "days": 1}), ("run_shell", {"cmd": "date"})]


def test_deepseek_v3_fenced_variant():
    text = f'{B}{CB}function{SEP}get_weather\n```json\n{{"city": "Lima"}}\n```{CE}{E}Done'
    msg = check(text, "deepseek_v3")
    assert calls(msg) == [("get_weather", {"city": "Lima"})] and msg.content == "Done"


def test_deepseek_malformed_calls():
    bad = f"{CB}get_weather{SEP}{{city: Oslo}}{CE}"
    # Next to a good call: the bad one alone is surfaced.
    msg = check(f'{B}{bad}{CB}run_shell{SEP}{{"cmd": "ls"}}{CE}{E}', "deepseek_v3")
    assert msg.content == bad and calls(msg) == [("run_shell", {"cmd": "ls"})]
    # Alone: the whole section, tags included.
    assert check(f"Hi {B}{bad}{E}", "deepseek_v3") == ParsedMessage(f"Hi {B}{bad}{E}", "", [])


def test_deepseek_missing_section_end_and_unclosed_call():
    msg = check(f'{B}{CB}run_shell{SEP}{{"cmd": "ls"}}{CE}{CB}get_weather{SEP}{{"ci', "deepseek_v3")
    assert calls(msg) == [("run_shell", {"cmd": "ls"})]
    assert msg.content == f'{CB}get_weather{SEP}{{"ci'


# ---- GLM ---------------------------------------------------------------------------------------
GLM = (
    "<think>Two lookups.</think>\nSure.\n"
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>123</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>4</arg_value>\n</tool_call>\n"
    '<tool_call>run_shell<arg_key>cmd</arg_key><arg_value>grep -n "x" a.py</arg_value>'
    '<arg_key>extra</arg_key><arg_value>{"k": [1]}</arg_value></tool_call>'
)


def test_glm_calls_typed_by_schema_and_json_for_unknown_keys():
    msg = check(GLM, "glm45")
    assert msg.reasoning == "Two lookups." and msg.content == "Sure."
    assert calls(msg) == [
        ("get_weather", {"city": "123", "days": 4}),
        ("run_shell", {"cmd": 'grep -n "x" a.py', "extra": {"k": [1]}}),
    ]


def test_glm_malformed_and_unclosed():
    bad = "<tool_call>get weather now</tool_call>"
    assert check("a " + bad, "glm45") == ParsedMessage("a " + bad, "", [])
    open_key = "<tool_call>run_shell\n<arg_key>cmd</arg_key>\n<arg_value>ls"
    assert check(open_key, "glm45") == ParsedMessage(open_key, "", [])


# ---- MiniMax-M2 --------------------------------------------------------------------------------
MINIMAX = (
    "<think>\nNeed both.\n</think>\n\nOn it.\n<minimax:tool_call>\n"
    '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
    '<parameter name="days">2</parameter>\n</invoke>\n'
    '<invoke name="run_shell">\n<parameter name="cmd">echo "a\nb"</parameter>\n</invoke>\n'
    "</minimax:tool_call>"
)


def test_minimax_parallel_invokes():
    msg = check(MINIMAX, "minimax_m2")
    assert msg.reasoning == "Need both." and msg.content == "On it."
    assert calls(msg) == [
        ("get_weather", {"city": "Paris", "days": 2}),
        ("run_shell", {"cmd": 'echo "a\nb"'}),
    ]


def test_minimax_malformed_invoke_and_bare_invoke_are_content():
    bad = '<minimax:tool_call>\n<invoke nam="x">\n</invoke>\n</minimax:tool_call>'
    assert check(bad, "minimax_m2") == ParsedMessage(bad, "", [])
    bare = 'Use <invoke name="x"></invoke> tags.'
    assert check(bare, "minimax_m2") == ParsedMessage(bare, "", [])


# ---- Kimi-K2 -----------------------------------------------------------------------------------
KS, KE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KB, KA, KC = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def test_kimi_k2_parallel_calls_and_malformed():
    text = (
        f'<think>plan</think>Checking.{KS}{KB}functions.get_weather:0{KA}{{"city": "Oslo"}}{KC}'
        f'{KB}functions.run_shell:1{KA}{{"cmd": "ls"}}{KC}{KE}'
    )
    msg = check(text, "kimi_k2")
    assert msg.reasoning == "plan" and msg.content == "Checking."
    assert calls(msg) == [("get_weather", {"city": "Oslo"}), ("run_shell", {"cmd": "ls"})]
    bad = f"{KS}{KB}functions.run_shell:0{KA}{{cmd}}{KC}{KE}"
    assert check(bad, "kimi_k2") == ParsedMessage(bad, "", [])
