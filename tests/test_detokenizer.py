"""Streaming detokenisation: whole UTF-8 characters only, stop strings held back and cut."""

from __future__ import annotations

import pytest

from freetoken.engine.detokenizer import IncrementalDetokenizer
from tiny_models import save_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("tok"))


def _stream(tok, text: str, stop: list[str]) -> tuple[list[str], bool]:
    d = IncrementalDetokenizer(tok, tok.encode("Hello", add_special_tokens=False), stop, True)
    pieces: list[str] = []
    hit = False
    for t in tok.encode(text, add_special_tokens=False):
        piece, hit = d.add_token(t)
        pieces.append(piece)
        if hit:
            break
    if not hit:
        pieces.append(d.flush())
    return pieces, hit


@pytest.mark.parametrize("text", ["Café 東京 🙂 naïve", "plain ascii words here", "🙂🙂 emoji-only 🙂"])
def test_stream_equals_full_decode_and_never_splits_characters(tok, text):
    pieces, _ = _stream(tok, text, [])
    assert "".join(pieces) == tok.decode(tok.encode(text, add_special_tokens=False))
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_cut_and_held_back(tok):
    pieces, hit = _stream(tok, "The answer is 42. STOP here and more", ["STOP"])
    assert hit
    assert "".join(pieces) == "The answer is 42. "
    # nothing that could still become "STOP" was emitted before the match
    assert all("S" not in p for p in pieces[:-1])


def test_partial_stop_prefix_released_when_it_diverges(tok):
    pieces, hit = _stream(tok, "a STO and STOP", ["STOP"])
    assert hit and "".join(pieces) == "a STO and "
    pieces, hit = _stream(tok, "ends with ST", ["STOP"])
    assert not hit and "".join(pieces) == "ends with ST"
