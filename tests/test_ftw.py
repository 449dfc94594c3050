"""FTW round trip on real files: ``ft convert`` of a tiny random Qwen3-MoE (float32) and of the fake FP8-block one,
then ``LLM(DST)``: the pool's banks are the original load's bit for bit, so prompt logits and greedy tokens equal
the original checkpoint's exactly; banks in another dtype than the compute dtype are converted while loading; the
files are aligned for direct I/O; O_DIRECT and buffered reads (tmpfs) give the same bytes; the checksum check runs
in the background by default and reports in the stats."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
from pathlib import Path

import pytest
import torch

from freetoken import LLM, SamplingParams
from freetoken.checkpoint import ftw_io, ftw_progress
from freetoken.checkpoint.ftw_io import Read, aligned_empty, byte_view, read_parts
from freetoken.checkpoint.ftw_manifest import ALIGNMENT, HUGE_PAGE, MANIFEST, read_manifest
from freetoken.cli.main import main as ft
from freetoken.loader.ftw_convert import convert
from tiny_models import save_checkpoint, save_fp8_checkpoint

PROMPTS = ([5, 6, 7, 8, 9], [11, 300, 42, 7, 7, 7, 2, 90, 91, 17, 3])
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def bf16_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("ftw")
    save_checkpoint("qwen3_moe", d / "src", seed=1, tokenizer=True)
    convert(d / "src", d / "dst", layers_per_file=1)
    return d / "src", d / "dst"


@pytest.fixture(scope="module")
def fp8_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("ftw8")
    save_fp8_checkpoint(d / "src", seed=5)
    assert ft(["convert", str(d / "src"), str(d / "dst")]) == 0
    return d / "src", d / "dst"


def _same_model(src: Path, dst: Path, dtype: str = "float32", backend: str = "cpu") -> LLM:
    a = LLM(str(src), device="cpu", dtype=dtype, moe_backend=backend)
    b = LLM(str(dst), device="cpu", dtype=dtype, moe_backend=backend)
    ba, bb = a.engine.setup.loaded.banks, b.engine.setup.loaded.banks
    assert ba is not None and bb is not None and ba.fmt == bb.fmt
    for x, y in zip(ba.tensors(), bb.tensors(), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))
    for p in PROMPTS:
        assert torch.equal(a.engine.score(p), b.engine.score(p))
    outs_a, outs_b = a.generate(list(PROMPTS), GREEDY), b.generate(list(PROMPTS), GREEDY)
    assert [o.token_ids for o in outs_a] == [o.token_ids for o in outs_b]
    b.check_integrity()
    return b


def test_converted_model_equals_the_original(bf16_pair: tuple[Path, Path]) -> None:
    b = _same_model(*bf16_pair)
    b.engine.weights_check.join(30)
    assert b.stats()["weights_check"] == "ok"  # checked in the background by default


def test_fp8_converted_model_equals_the_original(fp8_pair: tuple[Path, Path]) -> None:
    b = _same_model(*fp8_pair, backend="hybrid")
    banks = b.engine.setup.loaded.banks
    assert banks.fmt.name == "fp8_block" and banks.gate_up.dtype == torch.float8_e4m3fn  # still packed
    m = read_manifest(fp8_pair[1])
    assert m is not None and m.expert_format == "fp8_block"
    assert {x.name for x in m.banks} == {"gate_up", "down", "gate_up_scale", "down_scale"}


def test_banks_in_another_dtype_are_converted_while_loading(bf16_pair: tuple[Path, Path], caplog) -> None:
    src, dst = bf16_pair  # float32 banks, served in bfloat16: the same banks as loading the original in bfloat16
    with caplog.at_level(logging.INFO):
        b = _same_model(src, dst, dtype="bfloat16")
    assert "converting while reading" in caplog.text
    b.engine.weights_check.join(30)
    assert b.stats()["weights_check"] == "ok"  # the converted banks are checked from their files


def test_files_are_aligned_and_split_by_layer(bf16_pair: tuple[Path, Path]) -> None:
    _, dst = bf16_pair
    m = read_manifest(dst)
    assert m is not None
    gate_up = m.bank("gate_up")
    assert gate_up is not None and [p.rows for p in gate_up.parts] == [(0, 8), (8, 16)]  # one MoE layer a file
    for part in [p for b in m.banks for p in b.parts]:
        assert part.bank_offset % ALIGNMENT == 0 and part.file_bytes % ALIGNMENT == 0
        assert (dst / part.file).stat().st_size == part.file_bytes
    body = json.loads((dst / MANIFEST).read_text())
    assert body["config"] == json.loads((dst / "config.json").read_text())  # the model config it was made from
    assert body["experts"]["num_experts"] == 8 and body["experts"]["moe_layer_ids"] == [0, 2]
    assert (dst / "tokenizer.json").exists() and (dst / "config.json").exists()
    assert not list(dst.glob("*.py"))


def test_bank_memory_starts_on_a_huge_page() -> None:
    t = aligned_empty((3, 1000), torch.bfloat16)
    assert t.data_ptr() % HUGE_PAGE == 0 and t.shape == (3, 1000)
    assert len(byte_view(t, 0, 8192)) == 8192  # the slack past the end takes a padded last block


@pytest.mark.parametrize("refused", [None, "open", "read"])
def test_direct_and_buffered_reads_give_the_same_bytes(tmp_path: Path, refused: str | None, caplog,
                                                       monkeypatch) -> None:  # fmt: skip
    """Where the filesystem refuses O_DIRECT (tmpfs before Linux 6.6 at open, others at the first read: EINVAL,
    simulated here) the file is read buffered, said once."""
    data = torch.randint(0, 255, (3 * ftw_io.CHUNK + 3 * ALIGNMENT,), dtype=torch.uint8)
    path = tmp_path / "bank.ftw"
    path.write_bytes(data.numpy().tobytes())
    monkeypatch.setattr(ftw_io, "_warned_buffered", False)
    real_open, real_preadv = os.open, os.preadv

    def fake_open(p: object, flags: int, *a: object) -> int:
        if refused == "open" and flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(p, flags, *a)  # type: ignore[arg-type]

    def fake_preadv(fd: int, bufs: list, offset: int) -> int:
        if refused == "read" and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, bufs, offset)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "preadv", fake_preadv)
    for direct in (True, False, True):
        dst = aligned_empty(data.shape, torch.uint8)
        seen: list[int] = []
        with caplog.at_level(logging.WARNING):
            read_parts([Read(path, byte_view(dst, 0, len(data)), len(data))], direct=direct, on_bytes=seen.append)
        assert torch.equal(dst, data) and sum(seen) == len(data)
    assert caplog.text.count("does not take O_DIRECT") == (0 if refused is None else 1)


def test_progress_is_quiet_off_a_terminal_and_one_at_a_time(capsys) -> None:
    with ftw_progress.tracked(100, "x") as p:
        p.advance(60)
        assert ftw_progress.current() is p and p.describe().startswith("x: 0.0 / 0.0 GB")
        with pytest.raises(RuntimeError), ftw_progress.tracked(1, "y"):
            pass
    assert ftw_progress.current() is None
    assert capsys.readouterr().err == ""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("which", ["bf16", "fp8"])
def test_ftw_pool_is_pinned_in_place_and_serves_the_same_tokens_on_cuda(which: str, request) -> None:
    src, dst = request.getfixturevalue(f"{which}_pair")
    a = LLM(str(src), device="cuda", dtype="bfloat16", moe_backend="offload", expert_cache=0.5)
    b = LLM(str(dst), device="cuda", dtype="bfloat16", moe_backend="offload", expert_cache=0.5)
    pool = b.engine.setup.loaded.backend.pool
    banks = b.engine.setup.loaded.banks
    assert pool.pinned and pool.gate_up.data_ptr() == banks.gate_up.data_ptr()  # registered where it was read
    outs_a, outs_b = a.generate(list(PROMPTS), GREEDY), b.generate(list(PROMPTS), GREEDY)
    assert [o.token_ids for o in outs_a] == [o.token_ids for o in outs_b]
