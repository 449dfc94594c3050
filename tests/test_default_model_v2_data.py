"""The default model v2's training data (training/default_model_v2): agent prompts in the server's tool shape,
the held-out split (paths, cities, expressions, tool names) and the length curriculum of the batches."""

from __future__ import annotations

import random
from pathlib import Path
from types import ModuleType

import pytest

from freetoken.server.internal import ToolSpec
from training.default_model import evaluate as v1_evaluate
from training.default_model import render, split
from training.default_model_v2 import agent_data, agent_tasks, agent_tools, evaluate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mods() -> dict[str, ModuleType]:
    return {"agent_tasks": agent_tasks, "agent_tools": agent_tools, "agent_data": agent_data, "split": split,
            "render": render}


def test_tools_have_the_servers_rendered_shape(mods: dict[str, ModuleType]) -> None:
    conv = mods["agent_tasks"].agent_conversation(random.Random(3), 3000, "tool")
    for tool in conv["tools"]:
        fn = tool["function"]
        as_sent = ToolSpec(fn["name"], fn["description"], fn["parameters"]).template_dict()
        assert as_sent == tool
    names = [t["function"]["name"] for t in conv["tools"]]
    assert conv["meta"]["name"] in names and len(set(names)) == len(names)
    assert conv["messages"][0]["role"] == "system"


def test_the_request_is_last_and_the_call_copies_it(mods: dict[str, ModuleType]) -> None:
    rng = random.Random(5)
    for _ in range(20):
        conv = mods["agent_tasks"].agent_conversation(rng, 2000, "tool", with_result=False)
        user, reply = conv["messages"][-2], conv["messages"][-1]
        (value,) = conv["meta"]["arguments"].values()
        assert user["role"] == "user" and value in user["content"]
        assert reply["tool_calls"][0]["function"]["arguments"] == conv["meta"]["arguments"]


def test_training_side_never_uses_heldout_keys(mods: dict[str, ModuleType]) -> None:
    split, tasks = mods["split"], mods["agent_tasks"]
    canonical = mods["agent_tools"].canonical_names()
    rng = random.Random(11)
    for _ in range(150):
        conv = tasks.agent_conversation(rng, 1500, "tool", with_result=False)
        meta = conv["meta"]
        (value,) = meta["arguments"].values()
        key = {"weather": "city", "calculator": "expr"}.get(meta["kind"], "path")
        assert not split.is_heldout(key, value)
        assert meta["name"] in canonical or not split.is_heldout("tool", meta["name"])  # clients' own names: train
    held = [tasks.agent_conversation(rng, 1500, "tool", heldout=True, with_result=False)["meta"] for _ in range(40)]
    unseen = [m["name"] for m in held if m["name"] not in canonical]  # the rest: the clients' own names
    assert all(split.is_heldout("tool", n) for n in unseen) and 10 < len(unseen) < 30


def test_trained_pieces_are_the_reply_and_the_historys_calls(mods: dict[str, ModuleType]) -> None:
    rng = random.Random(2)
    histories = 0
    for _ in range(10):
        conv = mods["agent_tasks"].agent_conversation(rng, 4000, "tool")
        pieces = mods["agent_data"].agent_pieces(conv)
        assert "".join(t for t, _ in pieces) == mods["render"].render(conv)
        trained = [t for t, m in pieces if m]
        n_hist = sum(1 for m in conv["messages"] if m.get("_train"))
        histories += n_hist
        assert len(trained) == n_hist + 2
        for text in trained[:n_hist]:  # history calls: no thinking, the call, the end of the turn
            assert text.startswith("<tool_call>\n") and text.endswith("</tool_call><|im_end|>")
        assert trained[n_hist].startswith("<think>\n") and "<tool_call>" in trained[n_hist]
        assert trained[-1].endswith("<|im_end|>")
    assert histories > 10


def test_batches_keep_the_token_budget_and_the_curriculum(mods: dict[str, ModuleType]) -> None:
    data = mods["agent_data"]
    rng = random.Random(0)
    lengths = [rng.randint(100, 600) for _ in range(3000)] + [rng.randint(9000, 60000) for _ in range(40)]
    plan = data.plan_epoch(lengths, 65536, random.Random(1))
    assert sorted(i for g in plan for i in g) == list(range(len(lengths)))
    assert all(len(g) * data._padded(max(lengths[i] for i in g)) <= 65536 for g in plan)
    first = plan[: int(len(plan) * 0.1)]
    assert all(max(lengths[i] for i in g) <= data.LONG_FROM for g in first)


@pytest.mark.parametrize("style_seed", [0, 1, 2])
def test_agent_prompt_renders_alike_in_training_transformers_and_the_server(mods: dict[str, ModuleType],
                                                                            style_seed: int) -> None:
    """Training renders with render.py; evaluation with transformers; the server with freetoken.chat.template."""
    from transformers import AutoTokenizer

    from freetoken.chat.template import render as ft_render

    assets = ROOT / "src" / "freetoken" / "assets" / "default_model"
    conv = mods["agent_tasks"].agent_conversation(random.Random(style_seed), 3000, "tool")
    msgs, tools = conv["messages"], conv["tools"]
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    source = mods["render"].template_source()
    ours = mods["render"].render(conv, last_user + 1, add_generation_prompt=True)
    hf = AutoTokenizer.from_pretrained(assets).apply_chat_template(
        msgs[:last_user + 1], tools=tools, tokenize=False, add_generation_prompt=True)
    assert ours == hf == ft_render(source, msgs[:last_user + 1], tools, add_generation_prompt=True)
    calls = sum(1 for m in msgs[:last_user] if m.get("tool_calls"))
    assert ours.count("<tool_call>") == calls + 2  # the history's calls + the two in the format line


def test_heldout_prompts_fit_their_size_and_end_at_the_request(mods: dict[str, ModuleType]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ROOT / "src" / "freetoken" / "assets" / "default_model")

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    rows = evaluate.heldout_set("tool", 4, 18, lambda c: v1_evaluate.prompt_text(tok, c), count, 3000, 9000)
    for conv, text in rows:
        assert 3000 <= count(text) <= 9000 and text.endswith("<|im_start|>assistant\n")
        assert conv["messages"][-1]["role"] == "user"
        history_calls = [m["tool_calls"][0]["function"]["name"] for m in conv["messages"] if m.get("tool_calls")]
        assert conv["meta"]["name"] not in history_calls  # held out: the name must come from the tool list
