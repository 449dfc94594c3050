"""``ft``'s agent TTFT benchmark (``freetoken.bench.agent_ttft``) end to end on an untrained toy v2 through a real
``ft serve`` process: the first request has the size asked for by the server's own count, and the next turn reaches
the engine with the first request's prompt as its cached prefix (the Anthropic usage's ``cache_read_input_tokens``)."""

from __future__ import annotations

import json
from pathlib import Path

from freetoken.bench import agent_ttft
from training.default_model_v2 import untrained


def test_first_request_then_next_turn_reuses_its_prompt(tmp_path: Path) -> None:
    model = untrained.save_untrained(tmp_path / "v2toy", toy=True)
    out = tmp_path / "row.json"
    argv = ["--model", str(model), "--device", "cpu", "--prompt-tokens", "20000", "--next-tokens", "200",
            "--server-log", str(tmp_path / "server.log"), "--json", str(out)]  # fmt: skip
    assert agent_ttft.main(argv) == 0
    row = json.loads(out.read_text())
    assert row["first_prompt_tokens"] == 20000  # sized by the server's count_tokens, the filler exact
    assert row["first_ttft_s"] > 0 and row["next_ttft_s"] > 0
    # the next turn: the first prompt, the assistant turn and about 200 tokens of tool result
    assert 20000 + 150 < row["next_prompt_tokens"] < 20000 + 600
    # everything up to the first request's assistant turn comes from the prefix cache (the template's closing of
    # the user turn may differ where the assistant turn now follows it)
    assert 20000 - 16 <= row["next_cached_tokens"] < row["next_prompt_tokens"]
