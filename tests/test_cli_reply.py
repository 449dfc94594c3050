"""``ft chat`` / ``ft generate --chat`` show a reply's reasoning set apart from its answer, whatever pieces the text
streams in, and keep only the answer for the conversation; ``ft chat``'s commands never reach the model. The
embedded default model's real tokenizer and chat template (a Qwen3-style ``<think>`` family)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from freetoken.cli.reply import ReplyPrinter
from subproc import child_env

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ROOT / "src" / "freetoken" / "assets" / "default_model"
REPLY = "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(DEFAULT)


@pytest.mark.parametrize("piece", [1, 3, 7, len(REPLY)])
def test_reasoning_is_set_apart_and_left_out_of_the_answer(tok, piece: int) -> None:
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True,
                                     return_dict=False)  # fmt: skip
    out = io.StringIO()
    printer = ReplyPrinter(tok, "qwen3_moe", list(prompt), out)
    for i in range(0, len(REPLY), piece):
        printer.feed(REPLY[i : i + piece])
    answer = printer.finish()
    assert answer.strip() == "Hello! How can I help?"
    shown = out.getvalue()
    assert shown.index("[thinking]") < shown.index("The user greets me.") < shown.index("[/thinking]")
    assert shown.index("[/thinking]") < shown.index("Hello! How can I help?")
    assert "<think>" not in shown and "\x1b[" not in shown  # not a terminal: no colour codes


def test_a_reply_without_reasoning_is_shown_as_it_is(tok) -> None:
    out = io.StringIO()
    printer = ReplyPrinter(tok, "qwen3_moe", tok.encode("plain"), out)
    printer.feed("Just an answer.")
    assert printer.finish() == "Just an answer." and out.getvalue() == "Just an answer.\n"


def test_chat_commands_never_reach_the_model() -> None:
    env = child_env()
    r = subprocess.run(
        [sys.executable, "-m", "freetoken.cli", "chat", "--max-tokens", "4", "--device", "cpu"],
        input="/help\n/bogus\n/reset\n/exit\n", capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("/reset clears the conversation") == 3  # the banner, /help, and /bogus's line
    assert "unknown command /bogus" in r.stderr and "(conversation cleared)" in r.stderr
    assert r.stdout.count("> ") == 4 and "[thinking]" not in r.stdout  # no turn ran


def test_generate_chat_delimits_the_embedded_models_thinking() -> None:
    env = child_env()
    r = subprocess.run(
        [sys.executable, "-m", "freetoken.cli", "generate", "--chat", "--prompt", "What is 2+3?", "--max-tokens", "60",
         "--device", "cpu"], capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("[thinking]\n") and "[/thinking]\n" in out and "<think>" not in out, out
    assert "5" in out.split("[/thinking]\n", 1)[1]  # the answer, after the reasoning


def test_a_message_past_the_context_is_one_line_and_no_library_warning() -> None:
    env = child_env()
    r = subprocess.run(
        [sys.executable, "-m", "freetoken.cli", "chat", "--max-tokens", "2", "--device", "cpu"],
        input="word " * 3000 + "\n/exit\n", capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 2 and lines[1].startswith("(conversation too long: "), r.stderr  # after the banner
