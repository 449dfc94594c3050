"""``ft launch``'s file formats: the TOML writer (round trips; table edits that keep comments and unrelated tables)
and the JSON5 subset OpenClaw's config is read in."""

from __future__ import annotations

from typing import Any

import pytest
import tomllib
from hypothesis import example, given, settings
from hypothesis import strategies as st

from freetoken.launch import tomlw
from freetoken.launch.files import loads_json5
from launch_harness import CODEX_CONFIG

# ---------------------------------------------------------------------------- TOML

_scalar = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.booleans(),
    st.text(max_size=8),
    st.floats(allow_nan=False, allow_infinity=False),
)
_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _value, max_size=5))
@example({"0\n": {}})  # found by Hypothesis: a key ending in a newline passed for a bare key
@example({"0\n": []})
@example({"a\n": 1, "b": {"c\n": "x"}})
def test_toml_dumps_round_trips(doc: dict[str, Any]) -> None:
    assert tomllib.loads(tomlw.dumps(doc)) == doc




def test_set_tables_replaces_only_our_tables_and_keeps_comments() -> None:
    table = {"name": "FreeToken", "base_url": "http://h/v1"}
    out = tomlw.set_tables(
        CODEX_CONFIG, {("model_providers", "freetoken"): table, ("profiles", "freetoken"): None}
    )
    doc = tomllib.loads(out)
    assert doc["model_providers"] == {
        "other": {"name": "Other", "base_url": "https://other.example/v1"},
        "freetoken": table,
    }
    assert "profiles" not in doc or "freetoken" not in doc["profiles"]
    assert doc["mcp_servers"] == {"docs": {"command": "docs-mcp", "args": ["--port", "9"]}}
    for kept in ("# my codex settings", 'model = "gpt-5"  # keep me', "# docs server", "[mcp_servers.docs]"):
        assert kept in out
    assert tomlw.set_tables(out, {("model_providers", "freetoken"): table}) == out  # idempotent


def test_set_tables_rewrites_layouts_it_cannot_edit_and_refuses_broken_files() -> None:
    dotted = 'model_providers.freetoken.base_url = "stale"\nmodel = "m"\n'
    out = tomlw.set_tables(dotted, {("model_providers", "freetoken"): {"base_url": "new"}})
    assert tomllib.loads(out) == {"model": "m", "model_providers": {"freetoken": {"base_url": "new"}}}
    with pytest.raises(tomllib.TOMLDecodeError):
        tomlw.set_tables("model = ", {("a",): {"b": 1}})


def test_json5_subset() -> None:
    text = """{
      // comment, with "quotes" and a trailing comma inside: ,}
      gateway: { port: 18789, },
      'single': 'it\\'s "x"',
      /* block */ "url": "http://a//b",
      list: [1, 2,],
    }"""
    assert loads_json5(text) == {
        "gateway": {"port": 18789},
        "single": 'it\'s "x"',
        "url": "http://a//b",
        "list": [1, 2],
    }
