"""A scripted 8-turn chat over HTTP: clients re-send the history, the template drops earlier thinking; everything
before the first token the template changed is reused from the radix cache (page granularity)."""

from __future__ import annotations

import httpx

from freetoken.loader.model_setup import default_model_path
from freetoken.server.settings import ServerConfig
from server_harness import real_engine, serve

NAME = "freetoken-default"
QUESTIONS = ["What is 12 + 7?", "Hello! Who are you?", "add 31 and 45", "What is 8 * 9?",
             "How many items are in this list: cat, dog, sun?", "23 minus 19", "What is 56 + 27?", "Thanks!"]


def test_eight_turns_reuse_everything_before_the_first_changed_token(capsys):
    import openai

    with serve(real_engine(str(default_model_path())), ServerConfig(served_model_names=(NAME,))) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
        page = srv.engine.engine.config.page_size
        messages: list[dict] = [{"role": "system", "content": "You are a helpful assistant."}]
        rows = []
        prev_prompt = 0
        for turn, q in enumerate(QUESTIONS):
            messages.append({"role": "user", "content": q})
            before = httpx.get(srv.url + "/v1/engine/stats").json()["engine"]
            r = client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=96)
            after = httpx.get(srv.url + "/v1/engine/stats").json()["engine"]
            reused = after["prefix_tokens_reused"] - before["prefix_tokens_reused"]
            prefilled = after["prefill_tokens"] - before["prefill_tokens"]
            n = r.usage.prompt_tokens
            rows.append((turn + 1, n, reused, prefilled))
            assert reused + prefilled == n  # every prompt token is either reused or computed once
            assert r.usage.prompt_tokens_details.cached_tokens == reused  # reported to the client too
            # The previous prompt is an unchanged prefix of this one (the template only rewrites the previous
            # assistant turn, which starts after it): all its whole pages must be reused.
            assert reused >= (prev_prompt // page) * page, rows
            prev_prompt = n
            # clients re-send the visible answer only; the model's thinking is not part of the history
            messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
        assert sum(r[2] for r in rows) > sum(r[3] for r in rows[1:])  # most of the later prompts came from cache
    with capsys.disabled():
        print("\nturn | prompt tokens | reused | prefilled")
        for row in rows:
            print(" | ".join(str(v) for v in row))
