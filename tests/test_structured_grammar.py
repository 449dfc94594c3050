"""Structured output below HTTP: the bitmask and its torch reference, each call format's grammar
(what it accepts the family's own parser reads back as the call), and the engine following a grammar."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from devices import DEVICES
from freetoken.chat import parse
from freetoken.chat.grammar import CallTool, Tags, forced_calls, json_answer
from freetoken.chat.grammar.lark import closed
from freetoken.engine.errors import InputError
from freetoken.engine.grammar import GrammarCompiler
from freetoken.loader.model_setup import default_model_path
from freetoken.runner.constraint import allowed_tokens, apply_bitmask, new_bitmask

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city"]}  # fmt: skip


def _reference(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            word = t // 32
            if word >= mask.shape[1] or not (int(mask[b, word]) >> (t % 32)) & 1:
                out[b, t] = float("-inf")
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vocab,words", [(70, 3), (64, 2), (100, 3)])  # a partial last word; tokens past the mask
def test_apply_bitmask_matches_the_bit_by_bit_reference(device: str, vocab: int, words: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(3, vocab, generator=g)
    mask = torch.randint(-(2**31), 2**31 - 1, (3, words), generator=g, dtype=torch.int64).to(torch.int32)
    got = apply_bitmask(logits.to(device), mask.to(device)).cpu()
    assert torch.equal(got, _reference(logits, mask))
    assert torch.equal(apply_bitmask(logits[1].to(device), mask[1].to(device)).cpu(), _reference(logits, mask)[1])


def test_new_bitmask_allows_everything_and_unpacks_per_bit() -> None:
    m = new_bitmask(2, 70)
    assert m.shape == (2, 3) and bool(allowed_tokens(m, 70).all())
    m[0, 1] = 1 << 5  # token 37 only, in word 1
    assert allowed_tokens(m, 70)[0].nonzero().flatten().tolist() == list(range(32)) + [37] + list(range(64, 70))


@pytest.fixture(scope="module")
def default_tok() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path())


def _follow(compiler: GrammarCompiler, grammar: str, tokenizer: Any, text: str) -> tuple[bool, bool]:
    """(every token of ``text`` was allowed and accepted, the grammar then allows only the end)."""
    c = compiler.compile(grammar)
    mask = new_bitmask(1, compiler.vocab_size)[0]
    for t in tokenizer.encode(text, add_special_tokens=False):
        c.fill_bitmask(mask)
        if not bool(allowed_tokens(mask, compiler.vocab_size)[t]) or not c.accept(t):
            return False, False
    return True, c.is_done()


# family, the call as the model writes it (with the default model's tokenizer the non-Qwen tags are plain text)
CALLS = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
    "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
    "minimax_m2": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Oslo</parameter>\n'
    '<parameter name="days">2</parameter>\n</invoke>\n</minimax:tool_call>',
    "deepseek_v3": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Oslo", "days": 2}'
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "kimi_k2": '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
    '{"city": "Oslo", "days": 2}<|tool_call_end|><|tool_calls_section_end|>',
}


@pytest.mark.parametrize("family", list(CALLS))
def test_each_format_forces_the_call_its_own_parser_reads(family: str, default_tok: Any) -> None:
    compiler = GrammarCompiler(default_tok, 2048, [2, 0])
    tags = Tags.of(default_tok)
    tools = [CallTool("get_weather", WEATHER), CallTool("noop", {"type": "object", "properties": {}})]
    grammar = forced_calls(family, tools, tags, parallel=False)
    assert _follow(compiler, grammar, default_tok, CALLS[family]) == (True, True)
    tool_dicts = [{"type": "function", "function": {"name": t.name, "parameters": t.parameters}} for t in tools]
    msg = parse(CALLS[family], family, tool_dicts)
    assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [("get_weather", {"city": "Oslo", "days": 2})]
    assert msg.content == ""
    wrong = CALLS[family].replace("Oslo", "Oslo", 1).replace("2", '"two"' if family != "glm45" else "two", 1)
    if family in ("hermes", "deepseek_v3", "kimi_k2", "qwen3_coder", "minimax_m2"):
        assert _follow(compiler, grammar, default_tok, wrong)[0] is False  # an integer argument must be one


def test_reasoning_block_then_the_call(default_tok: Any) -> None:
    compiler = GrammarCompiler(default_tok, 2048, [2, 0])
    tags = Tags.of(default_tok)
    assert tags("<tool_call>") == "<tool_call>" and tags("<invoke") == '"<invoke"'  # special token vs text
    call, think = CALLS["hermes"], "<think>\nhmm\n</think>\n\n"
    tools = [CallTool("get_weather", WEATHER)]
    for mode, text in (("optional", think + call), ("optional", call), ("open", "hmm</think>" + call)):
        assert _follow(compiler, forced_calls("hermes", tools, tags, False, mode), default_tok, text) == (True, True)
    one = forced_calls("hermes", tools, tags, False, "none")
    assert _follow(compiler, one, default_tok, think + call)[0] is False
    assert _follow(compiler, one, default_tok, call + "\n" + call)[0] is False
    parallel = forced_calls("hermes", tools, tags, True, "none")
    assert _follow(compiler, parallel, default_tok, call) == (True, False)  # another call may follow
    assert _follow(compiler, parallel, default_tok, call + "\n" + call)[0] is True


def test_custom_tool_inputs_follow_their_grammar(default_tok: Any) -> None:
    compiler = GrammarCompiler(default_tok, 2048, [2, 0])
    tags = Tags.of(default_tok)
    lark = CallTool("apply_patch", {}, "lark", 'start: "*** Begin Patch\\n" /[a-z ]+/ "\\n*** End Patch"')
    regex = CallTool("digits", {}, "regex", "[0-9]{3}")
    raw = forced_calls("qwen3_coder", [lark, regex], tags, parallel=False)
    patch = (
        "<tool_call>\n<function=apply_patch>\n<parameter=input>\n*** Begin Patch\nfix it\n*** End Patch\n"
        "</parameter>\n</function>\n</tool_call>"
    )
    assert _follow(compiler, raw, default_tok, patch) == (True, True)
    assert _follow(compiler, raw, default_tok, patch.replace("*** Begin", "*** Start"))[0] is False
    as_json = forced_calls("hermes", [regex], tags, parallel=False)
    ok = '<tool_call>\n{"name": "digits", "arguments": {"input": "123"}}\n</tool_call>'
    assert _follow(compiler, as_json, default_tok, ok) == (True, True)
    assert _follow(compiler, as_json, default_tok, ok.replace("123", "12a"))[0] is False


def test_json_answers_are_closed_objects(default_tok: Any) -> None:
    compiler = GrammarCompiler(default_tok, 2048, [2, 0])
    tags = Tags.of(default_tok)
    g = json_answer(WEATHER, tags)
    assert _follow(compiler, g, default_tok, '{"city": "Oslo"}') == (True, True)
    assert _follow(compiler, g, default_tok, '{"city": "Oslo", "extra": 1}')[0] is False
    assert _follow(compiler, json_answer(None, tags), default_tok, '{"anything": [1, 2]}') == (True, True)
    assert closed({"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}) == {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {}, "additionalProperties": False}},
        "additionalProperties": False,
    }
    assert closed({"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}})[
        "additionalProperties"
    ] == {"type": "integer", "minimum": 0, "maximum": 2**53 - 1}
    digits = json_answer({"type": "integer"}, tags)
    assert _follow(compiler, digits, default_tok, str(2**53 - 1)) == (True, True)  # 16 digits, then nothing more
    assert _follow(compiler, digits, default_tok, str(2**53))[0] is False


def test_a_bad_grammar_is_an_input_error(default_tok: Any) -> None:
    with pytest.raises(InputError, match="invalid grammar"):
        GrammarCompiler(default_tok, 2048, [2]).compile("start: undefined_rule")


# ---- the engine follows the grammar ---------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from freetoken import LLM
    from tiny_models import save_checkpoint

    d = Path(tmp_path_factory.mktemp("grammar"))
    save_checkpoint("qwen3_moe", d, seed=0, tokenizer=True)
    return LLM(str(d), device="cpu", dtype="float32")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_random_model_writes_only_what_the_grammar_allows(tiny_llm: Any, temperature: float) -> None:
    from freetoken import SamplingParams

    grammar = 'start: "ID-" /[0-9]{3}/ ("-" ("ok" | "no"))?'
    prompts = [[5, 6, 7 + i] for i in range(4)]
    params = SamplingParams(max_tokens=40, temperature=temperature, seed=1, grammar=grammar)
    for r in tiny_llm.generate(prompts, params):
        assert r.finish_reason == "stop"
        text = r.text
        assert text.startswith("ID-") and text[3:6].isdigit() and text[6:] in ("", "-ok", "-no"), text
    free = tiny_llm.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=temperature, seed=1))[0]
    assert not free.text.startswith("ID-")  # the grammar, not the model, wrote that
    tiny_llm.check_integrity()


def test_the_engine_refuses_a_bad_grammar_before_queueing(tiny_llm: Any) -> None:
    from freetoken import SamplingParams

    with pytest.raises(InputError, match="invalid grammar"):
        tiny_llm.generate([[5, 6]], SamplingParams(max_tokens=4, grammar="start: nowhere"))
    assert not tiny_llm.engine.has_unfinished()


def test_harmony_forces_one_commentary_call(default_tok: Any) -> None:
    compiler = GrammarCompiler(default_tok, 2048, [2, 0])
    grammar = forced_calls("harmony", [CallTool("get_weather", WEATHER)], Tags.of(default_tok))
    text = (
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>'
    )
    assert _follow(compiler, grammar, default_tok, text) == (True, True)
    msg = parse(text.removesuffix("<|call|>"), "gpt_oss", [{"type": "function", "function": {"name": "get_weather"}}])
    assert [(c.name, c.arguments) for c in msg.tool_calls] == [("get_weather", '{"city": "Oslo"}')]
    assert msg.reasoning == "Need weather." and msg.content == ""


def test_added_tokens_are_tags_and_text_closers_end_at_their_first_occurrence(tmp_path: Path) -> None:
    """Qwen3's own tokenizer has <think>/<tool_call> as added tokens that are not special: still one
    token each, written as tokens. A closer that is no token (Qwen3-Coder's </parameter>) ends a value
    at its first occurrence, as the parser reads it."""
    from tiny_models import save_tokenizer

    tok = save_tokenizer(tmp_path)
    tags = Tags.of(tok)
    assert tags("</think>") == "</think>" and tags("<tool_call>") == "<tool_call>"
    compiler = GrammarCompiler(tok, len(tok), [tok.eos_token_id])
    grammar = forced_calls("hermes", [CallTool("get_weather", WEATHER)], tags, False, "optional")
    assert _follow(compiler, grammar, tok, "<think>\nhm\n</think>\n\n" + CALLS["hermes"]) == (True, True)
    coder = forced_calls("qwen3_coder", [CallTool("get_weather", WEATHER)], tags, False)
    call = CALLS["qwen3_coder"]
    assert _follow(compiler, coder, tok, call) == (True, True)
    twice = call.replace("Oslo\n</parameter>", "Oslo\n</parameter>\nmore\n</parameter>")
    assert _follow(compiler, coder, tok, twice)[0] is False


def test_auto_with_a_grammar_tool_leaves_text_free_and_holds_calls_to_their_grammar(default_tok: Any) -> None:
    from freetoken.chat.grammar import tool_calls_anywhere

    compiler = GrammarCompiler(default_tok, 2048, [2, 0])
    tags = Tags.of(default_tok)
    patch = CallTool("apply_patch", {}, "lark", 'start: "*** Begin Patch\\n" /[a-z ]+/ "\\n*** End Patch"')
    grammar = tool_calls_anywhere("qwen3_coder", [patch, CallTool("get_weather", WEATHER)], tags, True, "optional")
    call = (
        "<tool_call>\n<function=apply_patch>\n<parameter=input>\n*** Begin Patch\nfix it\n*** End Patch\n"
        "</parameter>\n</function>\n</tool_call>"
    )
    assert _follow(compiler, grammar, default_tok, "No call needed, just text.")[0] is True
    assert _follow(compiler, grammar, default_tok, "<think>\nok\n</think>\n\nLet me patch.\n" + call)[0] is True
    assert _follow(compiler, grammar, default_tok, "Patch:\n" + call.replace("Begin", "Start"))[0] is False
    with pytest.raises(ValueError, match="not one token"):  # <minimax:tool_call> is text in this tokenizer
        tool_calls_anywhere("minimax_m2", [patch], tags)
