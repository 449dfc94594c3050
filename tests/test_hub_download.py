"""``--model ORG/NAME`` through the real ``huggingface_hub`` client against a loopback Hub (``tests/hub_server.py``):
a tiny checkpoint downloaded (only what the engine reads) and served, a dropped download resumed, an unsupported
family refused before any weight byte, gated and unknown-revision refusals, offline reuse, ``ft models``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from freetoken.loader.hub import forget_resolved, resolve_model
from freetoken.loader.hub_files import HubError
from hub_server import FakeHub, HubServer
from tiny_models import save_checkpoint

REPO = "tiny/qwen3-moe"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    save_checkpoint("qwen3_moe", d, max_shard_size="300KB", tokenizer=True)
    return d


@pytest.fixture(scope="module")
def hub(ckpt: Path, tmp_path_factory: pytest.TempPathFactory):
    falcon = tmp_path_factory.mktemp("falcon")
    for p in ckpt.iterdir():
        shutil.copy(p, falcon / p.name)
    cfg = json.loads((falcon / "config.json").read_text())
    (falcon / "config.json").write_text(json.dumps({**cfg, "architectures": ["FalconForCausalLM"]}))
    gptq = tmp_path_factory.mktemp("gptq")
    for p in ckpt.iterdir():
        shutil.copy(p, gptq / p.name)
    qc = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (gptq / "config.json").write_text(json.dumps({**cfg, "quantization_config": qc}))
    with HubServer() as h:
        # what the engine never reads: a duplicate tree and another weight format
        h.add(REPO, ckpt, extra={"original/consolidated.safetensors": b"\0" * 4096, "pytorch_model.bin": b"\0" * 64})
        h.add("tiny/falcon", falcon)
        h.add("tiny/gptq", gptq)
        h.add("tiny/gated", ckpt, gated_token="hf_granted")
        yield h


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub: FakeHub) -> Path:
    """A fresh HF_HOME pointed at the loopback Hub (huggingface_hub reads its settings at import: set both)."""
    from huggingface_hub import constants

    home = tmp_path / "hf"
    for k, v in {"HF_HOME": str(home), "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}.items():
        monkeypatch.setenv(k, v)
    for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(k, raising=False)
    _point(monkeypatch, hub.url)
    for k, v in {"HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_HUB_OFFLINE": False,
                 "HF_TOKEN_PATH": str(home / "token"), "HF_STORED_TOKENS_PATH": str(home / "stored_tokens")}.items():
        monkeypatch.setattr(constants, k, v)  # fmt: skip
    forget_resolved()
    hub.log.clear()
    return home / "hub"


def _point(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")


def test_downloads_only_what_the_engine_reads_and_serves_it(cache: Path, hub: FakeHub, ckpt: Path) -> None:
    from freetoken import LLM, SamplingParams

    said: list[str] = []
    path = resolve_model(REPO, said.append)
    assert path.parent == cache / "models--tiny--qwen3-moe" / "snapshots" and path.name == hub.repos[REPO].commit
    shards = sorted(p.name for p in ckpt.glob("*.safetensors"))
    assert len(shards) > 1  # the index names them
    assert sorted(p.name for p in path.iterdir()) == sorted(["config.json", "generation_config.json",
        "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", *shards])
    assert all((path / s).read_bytes() == (ckpt / s).read_bytes() for s in shards)
    assert not any("original/" in (r.filename or "") or r.filename == "pytorch_model.bin" for r in hub.log)
    assert said and said[0].startswith(f"downloading {REPO} at ") and "GiB into" in said[0]

    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    ours = LLM(REPO, device="cpu", dtype="float32", moe_backend="fused").generate("hello world", greedy)[0]
    local = LLM(str(ckpt), device="cpu", dtype="float32", moe_backend="fused").generate("hello world", greedy)[0]
    assert len(ours.token_ids) == 4 and ours.token_ids == local.token_ids


def test_a_dropped_connection_is_resumed_with_a_range_request(
    cache: Path, hub: FakeHub, ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)  # the Hub's shards are far larger than its chunks
    shard = sorted(p.name for p in ckpt.glob("*.safetensors"))[0]
    size = (ckpt / shard).stat().st_size
    hub.drops[f"{REPO}/{shard}"] = 1
    path = resolve_model(REPO, lambda _: None)
    assert (path / shard).read_bytes() == (ckpt / shard).read_bytes()
    gets = [r for r in hub.log if r.filename == shard and r.method == "GET"]
    assert [g.range is None for g in gets] == [True, False]
    start = int(gets[1].range.removeprefix("bytes=").removesuffix("-"))  # type: ignore[union-attr]
    assert 0 < start <= size // 2  # the second asks only for what the first did not deliver (whole chunks kept)


def test_an_interrupted_run_keeps_what_it_fetched(
    cache: Path, hub: FakeHub, ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops mid-file, then gives nothing through huggingface_hub's retries (5, 1 s apart): the run
    fails with one line, and the next run fetches only the file that was cut."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)
    shard = sorted(p.name for p in ckpt.glob("*.safetensors"))[-1]  # the last file fetched
    hub.drops[f"{REPO}/{shard}"], hub.starves[f"{REPO}/{shard}"] = 1, 5
    with pytest.raises(HubError, match=r"^tiny/qwen3-moe: the download was interrupted \(RemoteProtocolError: .*"
                                       r"run again: the files already fetched are kept$"):  # fmt: skip
        resolve_model(REPO, lambda _: None)
    gets = [r for r in hub.log if r.method == "GET" and r.filename]
    assert [r.range is None for r in gets if r.filename == shard] == [True] + [False] * 5  # resumed, then given up
    forget_resolved()
    hub.log.clear()
    path = resolve_model(REPO, lambda _: None)
    assert (path / shard).read_bytes() == (ckpt / shard).read_bytes()
    assert [r.filename for r in hub.log if r.method == "GET" and r.filename] == [shard]


@pytest.mark.parametrize(("repo", "why"), [
    ("tiny/falcon", r"config.json: unsupported architecture 'FalconForCausalLM'; supported: "),
    ("tiny/gptq", r"config.json: uses quantization 'gptq' \(4-bit, group 128\): not supported yet"),
])  # fmt: skip
def test_an_unsupported_family_or_format_is_refused_before_any_weight_byte(
    cache: Path, hub: FakeHub, repo: str, why: str
) -> None:
    with pytest.raises(HubError, match=rf"^{repo}: this engine cannot serve it, nothing else downloaded \({why}"):
        resolve_model(repo)
    fetched = {r.filename for r in hub.log if r.filename}
    assert hub.weight_requests(repo) == [] and fetched == {"config.json"}


def test_a_download_that_cannot_fit_is_refused_first(cache: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:  # fmt: skip
    from freetoken.loader import hub_files

    monkeypatch.setattr(hub_files, "DISK_MARGIN", 1 << 60)  # no disk has an exbibyte free
    with pytest.raises(HubError, match=r"^tiny/qwen3-moe: needs 0\.0 GiB \(\+ 1073741824 GiB margin\) in .* GiB free"):
        resolve_model(REPO)
    assert hub.weight_requests(REPO) == []


def test_gated_repo_needs_a_token(
    cache: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(HubError, match=r"^tiny/gated is gated: accept its terms at https://huggingface.co/tiny/gated "
                                       "and set HF_TOKEN"):  # fmt: skip
        resolve_model("tiny/gated")
    assert hub.weight_requests("tiny/gated") == []
    assert [r.status for r in hub.log if r.filename == "config.json"] == [401]  # no token
    from freetoken.cli.main import main

    assert main(["generate", "--model", "tiny/gated", "--prompt", "hi", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ft generate: error: tiny/gated is gated: accept its terms at https://huggingface.co/tiny/gated and "
                   "set HF_TOKEN to a token of that account"]  # fmt: skip
    monkeypatch.setenv("HF_TOKEN", "hf_other")  # a token without access: 403
    with pytest.raises(HubError, match=r"^tiny/gated is gated: accept its terms"):
        resolve_model("tiny/gated")
    assert [r.status for r in hub.log if r.filename == "config.json"][-1] == 403
    monkeypatch.setenv("HF_TOKEN", "hf_granted")  # read when asked, as huggingface_hub does
    assert (resolve_model("tiny/gated", lambda _: None) / "config.json").is_file()


def test_unknown_revision_and_repo_get_one_line_each(cache: Path) -> None:
    with pytest.raises(HubError, match=r"^tiny/qwen3-moe has no revision 'nope' \(a branch, tag or commit"):
        resolve_model(f"{REPO}@nope")
    with pytest.raises(HubError, match=r"^tiny/absent: no such local directory, and no Hugging Face repo"):
        resolve_model("tiny/absent")


def test_offline_uses_the_cache_and_says_so(cache: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    with pytest.raises(HubError, match=r"offline \(HF_HUB_OFFLINE=1\), and it is not in the cache"):
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        resolve_model(REPO)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    online = resolve_model(REPO, lambda _: None)
    hub.log.clear()
    for offline, why in ((True, "offline (HF_HUB_OFFLINE=1)"), (False, "the Hub cannot be reached")):
        forget_resolved()
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
        if not offline:
            _point(monkeypatch, "http://127.0.0.1:9")  # nothing listens there
        said: list[str] = []
        assert resolve_model(REPO, said.append) == online
        assert len(said) == 1 and said[0].startswith(why)
        assert said[0].endswith(f": using the cached {REPO} (commit {online.name[:12]})")
    assert hub.log == []


def test_ft_models_lists_the_cache(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from freetoken.cli.main import main

    assert main(["models"]) == 0 and "no models in" in capsys.readouterr().out
    resolve_model(REPO, lambda _: None)
    with pytest.raises(HubError):
        resolve_model("tiny/falcon")
    assert main(["models"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {cells[0]: cells for line in out if len(cells := [c.strip() for c in line.split("│")[1:-1]]) == 6}
    assert {k for k in rows if k.startswith("tiny/")} == {REPO, "tiny/falcon"}
    assert rows[REPO][1:] == ["main", rows[REPO][2], "Qwen3MoeForCausalLM", "float32", "yes"]
    assert rows[REPO][2].endswith(("KiB", "MiB")) and rows["tiny/falcon"][3:] == ["FalconForCausalLM", "float32", "no"]
    assert any(line.startswith("tiny/falcon (main): ") and "unsupported architecture" in line for line in out)
