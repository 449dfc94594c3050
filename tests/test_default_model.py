"""The embedded default model: checkpoint layout, tokenizer, chat template, data split, and
greedy held-out arithmetic through FreeToken's own engine (CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment
from safetensors import safe_open

from training.default_model import evaluate, generate, render, split

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "src" / "freetoken" / "assets" / "default_model"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
            "</tool_call>", "<tool_response>", "</tool_response>"]


@pytest.fixture(scope="module")
def mods() -> dict[str, ModuleType]:
    return {"generate": generate, "render": render, "split": split, "evaluate": evaluate}


def test_checkpoint_layout_and_size() -> None:
    cfg = json.loads((ASSETS / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    n_exp, top_k = cfg["num_experts"], cfg["num_experts_per_tok"]
    assert n_exp >= 16 and 2 <= top_k <= 4
    index = json.loads((ASSETS / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    sizes = [(ASSETS / s).stat().st_size for s in shards]
    assert all(s <= 15 * 2**20 for s in sizes) and sum(sizes) <= 30_000_000
    keys: set[str] = set()
    for s in shards:
        with safe_open(str(ASSETS / s), "pt") as f:
            for k in f.keys():
                assert str(f.get_slice(k).get_dtype()) == "BF16", k
                keys.add(k)
    assert keys == set(index["weight_map"])
    for layer in range(cfg["num_hidden_layers"]):  # HF Qwen3-MoE layout: one tensor per expert and proj
        assert f"model.layers.{layer}.mlp.gate.weight" in keys
        for e in range(n_exp):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                assert f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight" in keys


def test_tokenizer_and_generation_config() -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ASSETS / "tokenizer.json"))
    assert tok.get_vocab_size() <= 4096
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    assert all(i is not None for i in ids.values())
    for s, i in ids.items():  # special tokens are never split
        assert tok.encode(f"a{s}b", add_special_tokens=False).ids[1] == i
    assert tok.encode("1234567890", add_special_tokens=False).tokens == list("1234567890")
    gen = json.loads((ASSETS / "generation_config.json").read_text())
    assert set(gen["eos_token_id"]) == {ids["<|im_end|>"], ids["<|endoftext|>"]}
    tcfg = json.loads((ASSETS / "tokenizer_config.json").read_text())
    assert tcfg["eos_token"] == "<|im_end|>" and "<tools>" in tcfg["chat_template"]


def _tool_conversation(mods: dict[str, ModuleType]) -> dict[str, Any]:
    """Tool flow after an earlier exchange, tools with sorted keys (what plain Jinja's tojson prints)."""
    import random

    rng = random.Random(3)
    while True:
        conv = mods["generate"].tool_conversation(rng)
        if list(conv["tools"][0]) == ["function", "type"] and len(conv["messages"]) == 4:
            break
    earlier = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Hello!", "reasoning_content": "EARLIER-THOUGHT"}]
    # Up to the tool result: the prompt for the final answer.
    conv["messages"] = [{"role": "system", "content": "Be brief."}] + earlier + conv["messages"][:-1]
    return conv


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_chat_template_renders_alike_everywhere(mods: dict[str, ModuleType], enable_thinking: bool) -> None:
    from transformers import AutoTokenizer

    from freetoken.chat.template import render as ft_render

    conv = _tool_conversation(mods)
    msgs, tools = conv["messages"], conv["tools"]
    source = json.loads((ASSETS / "tokenizer_config.json").read_text())["chat_template"]
    kw: dict[str, Any] = {} if enable_thinking else {"enable_thinking": False}
    hf = AutoTokenizer.from_pretrained(ASSETS).apply_chat_template(
        msgs, tools=tools, tokenize=False, add_generation_prompt=True, **kw)
    plain = ImmutableSandboxedEnvironment().from_string(source).render(
        messages=msgs, tools=tools, add_generation_prompt=True, **kw)
    assert hf == plain == ft_render(source, msgs, tools, add_generation_prompt=True, **kw)
    call = msgs[-2]["tool_calls"][0]["function"]
    assert "<tools>\n" + json.dumps(tools[0]) in hf  # tools as JSON inside <tools></tools>
    hermes = f'{{"name": "{call["name"]}", "arguments": {json.dumps(call["arguments"])}}}'
    assert f"<tool_call>\n{hermes}\n</tool_call><|im_end|>" in hf
    assert "<|im_start|>user\n<tool_response>\n" + msgs[-1]["content"] + "\n</tool_response><|im_end|>" in hf
    assert "EARLIER-THOUGHT" not in hf and msgs[-2]["reasoning_content"] in hf  # Qwen3 drops old thinking
    assert hf.endswith("<|im_start|>assistant\n" + ("" if enable_thinking else "<think>\n\n</think>\n\n"))


def test_heldout_pairs_never_in_training(mods: dict[str, ModuleType]) -> None:
    gen, split = mods["generate"], mods["split"]
    seen_arith = seen_tool = 0
    for conv in gen.training_conversations(3000, seed=11):
        meta = conv["meta"]
        if meta["task"] == "arith":
            seen_arith += 1
            assert not split.is_heldout("arith", split.arith_key(meta["op"], meta["a"], meta["b"]))
        if meta["task"] == "tool":
            seen_tool += 1
            (arg,) = meta["arguments"].values()
            kind = {"weather": "city", "calculator": "expr"}.get(meta["kind"], "path")
            assert not split.is_heldout(kind, arg)
    assert seen_arith > 500 and seen_tool > 500
    for c in gen.heldout_arithmetic(50):
        assert split.is_heldout("arith", split.arith_key(c["meta"]["op"], c["meta"]["a"], c["meta"]["b"]))
    assert split.arith_key("add", 23, 19) == split.arith_key("add", 19, 23)  # commutative pairs held out together


def test_greedy_heldout_arithmetic_through_engine(mods: dict[str, ModuleType]) -> None:
    """>= 90% exact answers on the 50 held-out arithmetic prompts, greedy, FreeToken's engine on CPU,
    prompts tokenised the way the server does (freetoken.chat.template.render_and_tokenize)."""
    from freetoken import LLM, SamplingParams
    from freetoken.chat.template import render_and_tokenize

    ev = mods["evaluate"]
    llm = LLM(model=str(ASSETS), device="cpu", max_running_requests=50)
    source = json.loads((ASSETS / "tokenizer_config.json").read_text())["chat_template"]
    convs = mods["generate"].heldout_arithmetic(50)
    prompts = [render_and_tokenize(llm.tokenizer, source, c["messages"], None, True) for c in convs]
    outs = llm.generate(prompts, SamplingParams(max_tokens=80, temperature=0.0, skip_special_tokens=False))
    right = 0
    for conv, out in zip(convs, outs):
        nums = ev._INT.findall(ev.final_content(out.text.split("<|im_end|>")[0]))
        right += bool(nums) and int(nums[-1]) == conv["meta"]["answer"]
    assert right / len(convs) >= 0.9, f"{right}/50 held-out arithmetic prompts right"
