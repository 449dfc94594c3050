"""``ft bench agent-edits`` on a short session (tiny random Qwen3.5-MoE, CPU, through the HTTP server): with state
checkpoints at anchors every turn of each harness's edits re-prefills at most its new suffix and one page; on a
fixed grid it re-prefills at least as much; the grid's positions."""

from __future__ import annotations

import argparse

import pytest

from freetoken.bench import agent_edits, agent_session
from freetoken.bench.loopback import serve
from freetoken.bench.tiny_hybrid import save_checkpoint
from freetoken.cache.anchors import Anchors
from freetoken.config import EngineConfig

TURNS = 7


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    session = agent_session.build_session(TURNS, scale=0.3)
    model = save_checkpoint(tmp_path_factory.mktemp("tiny_qwen35"), session.texts())
    p = argparse.ArgumentParser()
    agent_edits.add_arguments(p)
    return str(model), session, p.parse_args(["--turns", str(TURNS), "--grid", "64"])


def _replay(setup, policy: str, mode: str, args: argparse.Namespace | None = None) -> list[agent_edits.TurnRow]:
    model, session, default = setup
    with serve(agent_edits.engine_factory(model, mode, args or default)) as running:
        return agent_edits.replay(running, session, agent_session.POLICIES[policy](session), policy, mode, TURNS)


@pytest.mark.parametrize("policy", list(agent_session.POLICIES))
def test_anchors_reprefill_only_the_new_suffix(setup, policy):
    rows = _replay(setup, policy, "anchors")
    assert agent_edits.over_bound(rows, setup[2].page_size) == [], rows
    # the edits are real: some turn's new suffix starts before the end of the previous prompt
    assert any(r.suffix > r.prompt - prev.prompt for prev, r in zip(rows, rows[1:])), rows
    assert all(r.prefilled >= r.suffix for r in rows)  # nothing below the minimum: the figures are honest


def test_a_small_device_tier_with_the_host_tier_keeps_the_bound(setup):
    """Four device checkpoint slots (fewer than one turn's anchors), the host tier holding the rest: the bound
    holds for OpenCode's deep prunes, as with a device tier large enough; both tiers' figures in the server's stats."""
    import httpx

    model, session, default = setup
    args = argparse.Namespace(**{**vars(default), "state_checkpoints": 4, "state_checkpoint_host_gib": 0.05})
    with serve(agent_edits.engine_factory(model, "anchors", args)) as running:
        rows = agent_edits.replay(running, session, agent_session.POLICIES["opencode"](session), "opencode",
                                  "anchors", TURNS)  # fmt: skip
        stats = httpx.get(running.url + "/v1/engine/stats").json()
    assert agent_edits.over_bound(rows, default.page_size) == [], rows
    engine = stats["engine"]
    assert engine["state_checkpoint_slots_device"] == 4 and engine["state_checkpoint_slots_host"] > 4, engine
    assert engine["state_checkpoints_host"] > 4 and engine["state_demoted"] > 0 and engine["state_spilled"] > 0
    assert engine["state_restores_host"] > 0, engine


def test_grid_reprefills_at_least_as_much(setup):
    anchors, grid = _replay(setup, "openclaw", "anchors"), _replay(setup, "openclaw", "grid")
    assert [r.prompt for r in anchors] == [r.prompt for r in grid]
    assert sum(r.prefilled for r in grid) > sum(r.prefilled for r in anchors)


def test_grid_positions():
    grid = Anchors(frozenset({7}), frozenset(), every=10)  # the special tokens are not read on a grid
    assert grid.positions([7] * 40, 0, 37, 4) == [8, 20, 28, 36]  # 10, 20, 30 rounded to pages, and the end
    assert grid.positions([7] * 40, 20, 37, 4) == [28, 36]
    with pytest.raises(ValueError, match="state_checkpoint_every must be >= 1"):
        EngineConfig(state_checkpoint_every=0)
