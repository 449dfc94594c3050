"""Bad FTW directories are refused at load naming the file: a truncated or padded bank file, a missing one, a
manifest whose banks do not match config.json or their own files; a corrupt file fails ``--verify`` (load) by
name, and in the default background check shows in the stats without stopping the engine. ``ft convert`` of a
checkpoint the loader refuses gives the loader's error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from freetoken import LLM
from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.ftw_manifest import MANIFEST
from freetoken.cli.main import main as ft
from freetoken.loader.ftw_convert import convert
from tiny_models import save_checkpoint


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ftwbad")
    save_checkpoint("qwen3_moe", d / "src", seed=2)
    convert(d / "src", d / "dst")
    return d / "dst"


@pytest.fixture
def copy(good: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(good, tmp_path / "ftw"))


def _load(d: Path, verify: str = "off") -> LLM:
    return LLM(str(d), device="cpu", dtype="float32", moe_backend="cpu", verify_weights=verify)


def _manifest(d: Path) -> dict:
    return json.loads((d / MANIFEST).read_text())


def _bank_file(d: Path, bank: str = "down") -> Path:
    return d / next(b for b in _manifest(d)["banks"] if b["name"] == bank)["parts"][0]["file"]


def test_a_truncated_bank_file_is_refused_by_name(copy: Path) -> None:
    f = _bank_file(copy)
    f.write_bytes(f.read_bytes()[:-4096])
    with pytest.raises(CheckpointError, match=rf"{f.name}: \d+ bytes, ftw.json says \d+ \(truncated\)"):
        _load(copy)


def test_a_file_longer_than_stated_is_refused_by_name(copy: Path) -> None:
    f = _bank_file(copy, "gate_up")
    f.write_bytes(f.read_bytes() + b"\0" * 4096)
    with pytest.raises(CheckpointError, match=rf"{f.name}: .*longer than stated"):
        _load(copy)


def test_a_missing_file_is_refused_by_name(copy: Path) -> None:
    f = next(copy.glob("model-*.safetensors"))
    f.unlink()
    with pytest.raises(CheckpointError, match=rf"{f.name}: named in ftw.json but missing"):
        _load(copy)


def test_a_manifest_that_does_not_match_config_is_refused(copy: Path) -> None:
    cfg = json.loads((copy / "config.json").read_text())
    cfg["moe_intermediate_size"] = 16
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"ftw.json: the banks were made for moe_intermediate_size = 32, "
                                              r"config.json says 16"):  # fmt: skip
        _load(copy)


def test_a_bank_shape_that_does_not_match_the_pool_is_refused_by_file(copy: Path) -> None:
    body = _manifest(copy)
    bank = next(b for b in body["banks"] if b["name"] == "down")
    bank["shape"] = [16, 32, 64]  # same bytes, the wrong layout
    (copy / MANIFEST).write_text(json.dumps(body))
    with pytest.raises(CheckpointError, match=rf"{bank['parts'][0]['file']}: bank down has shape \[16, 32, 64\]"):
        _load(copy)


def test_parts_that_do_not_cover_the_bank_are_refused_by_file(copy: Path) -> None:
    body = _manifest(copy)
    part = body["banks"][0]["parts"][0]
    part["rows"] = [0, 15]
    (copy / MANIFEST).write_text(json.dumps(body))
    with pytest.raises(CheckpointError, match=rf"{part['file']} \(rows 0..15"):
        _load(copy)


def _corrupt(f: Path, at: int = 100) -> None:
    b = bytearray(f.read_bytes())
    b[at] ^= 0x40
    f.write_bytes(bytes(b))


@pytest.mark.parametrize("which", ["bank", "non-expert"])
def test_a_corrupt_file_fails_verify_by_name(copy: Path, which: str) -> None:
    f = _bank_file(copy) if which == "bank" else next(copy.glob("model-*.safetensors"))
    _corrupt(f, at=-100 if which == "non-expert" else 100)
    with pytest.raises(CheckpointError, match=rf"{f.name}: checksum mismatch"):
        _load(copy, verify="load")


def test_a_corrupt_bank_is_reported_by_the_background_check(copy: Path, caplog) -> None:
    f = _bank_file(copy)
    _corrupt(f)
    llm = _load(copy, verify="background")  # serving starts; the check runs beside it
    llm.engine.weights_check.join(30)
    status = llm.stats()["weights_check"]
    assert status.startswith("mismatch: ") and f.name in status
    assert "WEIGHTS CORRUPT" in caplog.text
    assert len(llm.generate([[1, 2, 3]])[0].token_ids) > 0  # the engine serves on


def test_convert_refuses_what_the_loader_refuses_with_its_error(tmp_path: Path) -> None:
    src = tmp_path / "src"
    save_checkpoint("qwen3_moe", src, seed=2)
    state = load_file(src / "model.safetensors")
    state["model.layers.0.mlp.mystery.weight"] = torch.zeros(4)
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as loading:
        LLM(str(src), device="cpu", dtype="float32")
    with pytest.raises(CheckpointError) as converting:
        convert(src, tmp_path / "dst")
    assert str(converting.value) == str(loading.value) and "mystery" in str(loading.value)
    assert not (tmp_path / "dst" / MANIFEST).exists()


def test_ft_convert_says_errors_in_one_line(tmp_path: Path, good: Path, capsys) -> None:
    assert ft(["convert", str(good), str(tmp_path / "again")]) == 1
    assert "is an FTW directory already" in capsys.readouterr().err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    assert ft(["convert", str(good.parent / "src"), str(tmp_path / "busy")]) == 1
    assert "not an empty directory" in capsys.readouterr().err
