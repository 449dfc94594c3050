"""A ``tiktoken.model`` checkpoint (Kimi's layout) served through a converted tokenizers BPE: the conversion encodes
and decodes as the ``tiktoken`` library driven the way Kimi's wrapper drives it (tests/tiktoken_files.py: a BPE
trained here, Kimi's regex, its reserved specials and run cuts); the chat template; the cache (hit, miss, tampered
or truncated entries rebuilt); refusals; llguidance over a tokenizer with ids past the model's vocabulary (a
checkpoint shipping only ``tiktoken.model``, served: ``test_kimi_tiktoken_checkpoint.py``)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from freetoken.checkpoint.errors import CheckpointError
from freetoken.checkpoint.tiktoken_tokenizer import ISSPACE, RESERVED_SPECIAL_TOKENS, without_chunk_cut
from freetoken.checkpoint.tokenizer import load_tiktoken_tokenizer, load_tokenizer
from freetoken.checkpoint.tokenizer_cache import HASH_FILE, JSON_FILE, cache_key, cache_root, converted_tokenizer
from freetoken.engine.grammar import GrammarCompiler
from freetoken.loader.hub_files import small_files
from freetoken.runner.constraint import allowed_tokens, bitmask_words, new_bitmask
from tiktoken_files import (
    CORPUS,
    NAMED,
    kimi_config,
    reference_encode,
    reference_encoding,
    specials_of,
    train_ranks,
    write_kimi_tokenizer,
    write_tiktoken_model,
)


@pytest.fixture(scope="module")
def tok(kimi_dir: tuple[Path, dict[bytes, int]], tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_tiktoken_tokenizer(kimi_dir[0], str(tmp_path_factory.mktemp("ftcache")))



def _config(d: Path) -> dict[str, Any]:
    return dict(json.loads((d / "tokenizer_config.json").read_text()))


def _copy(kimi_dir: tuple[Path, dict[bytes, int]], tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    for name in ("tiktoken.model", "tokenizer_config.json"):
        (d / name).write_bytes((kimi_dir[0] / name).read_bytes())
    return d


def _edit_config(d: Path, **changes: Any) -> None:
    (d / "tokenizer_config.json").write_text(json.dumps({**_config(d), **changes}))


def test_the_run_cut_whitespace_is_pythons_isspace() -> None:
    assert set(ISSPACE) == {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}


TEXTS = {
    "corpus": CORPUS,
    "empty": "",
    "spaces": "  leading spaces\n\n\n  trailing   \t\r\n \n",
    "mixed_scripts": "中文English混合123456789 русский ÀÉÎõü ǅǆ ﬁ x²",
    "contractions": "I'M sure you'LL see they'Re DON'T it's",
    "code": "def f(x):\n\treturn {'a': [1, 2, 3]} if x else None  # ok\n\n\nclass A:\n    pass\n",
    "emoji": "😀😀😀 🚀✨ 👩‍👩‍👧 \U0001f600x",
    "odd_space": "\u3000\u3000ab\u2028cd\x1c\x1c ef\x85g\xa0h",
    "specials": "<|im_user|>user<|im_middle|>hi<|im_end|>[BOS]x[EOS]",
    "reserved": "a<|reserved_token_600|>b <|media_begin|><|media_end|>",
    "almost_special": "<|im_end| <|reserved_token_1|> [BOS",
    "repeats": "aaaaaaaaaaaaaaaa abababababab 1111111111 ....... ====",
    "space_run_at_cut": " " * 25_000 + "x" + " " * 25_001 + "y" + " " * 50_000 + "z",
    "word_run_at_cut": "y" * 25_000 + " " + "z" * 50_001 + " w" + "é" * 30_000,
    "newline_run": "\n" * 30_000 + "end",
    "past_a_chunk": "fibonacci(n) + 1\n" * 25_000 + "tail",  # 425,004 characters: one chunk cut, mid-word
}


@pytest.mark.parametrize("name", list(TEXTS))
def test_encode_and_decode_match_tiktoken(name: str, tok: Any, kimi_enc: Any) -> None:
    text = TEXTS[name]
    want = reference_encode(kimi_enc, text)
    got = tok.encode(text, add_special_tokens=False)
    assert got == want
    assert tok.decode(got) == kimi_enc.decode(want) == text


def test_random_strings_match_tiktoken(tok: Any, kimi_enc: Any) -> None:
    rng = random.Random(0)
    alphabet = "ab cA1'.,\n\t中é😀\x1c\u3000-_"
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        assert tok.encode(text, add_special_tokens=False) == reference_encode(kimi_enc, text), repr(text)


def test_a_larger_vocabulary_on_this_repositorys_own_files(tmp_path: Path) -> None:
    """4,000 merges trained on the repository's docs and sources (real prose and code, many tokens with several
    splits): every docs page and source file encodes as tiktoken does."""
    root = Path(__file__).resolve().parents[1]
    files = sorted((root / "docs").glob("*.md")) + sorted((root / "src" / "freetoken" / "engine").glob("*.py"))
    texts = [p.read_text() for p in files]
    ranks = train_ranks(4000, texts[::2] + [CORPUS])
    d = tmp_path / "big"
    d.mkdir()
    write_tiktoken_model(d / "tiktoken.model", ranks)
    (d / "tokenizer_config.json").write_text(json.dumps(kimi_config(len(ranks))))
    tok = load_tiktoken_tokenizer(d, str(tmp_path / "cache"))
    kimi_enc = reference_encoding(ranks)
    assert len(ranks) > 3000
    for path, text in zip(files, texts):
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == reference_encode(kimi_enc, text), path.name
        assert tok.decode(ids) == text


def test_the_cuts_change_tokens_and_are_kimis(tok: Any, kimi_enc: Any) -> None:
    """The cuts are observable (other sizes, or none, give other tokens), and the converted tokenizer makes Kimi's."""
    text = "fibonacci" * 3_000 + " " + "xyz"
    want = reference_encode(kimi_enc, text)
    assert reference_encode(kimi_enc, text, run=20_000) != want and reference_encode(kimi_enc, text, run=10**9) != want
    assert tok.encode(text, add_special_tokens=False) == want
    long = TEXTS["past_a_chunk"]
    assert reference_encode(kimi_enc, long, chunk=10**9) != reference_encode(kimi_enc, long)


def test_bytes_that_are_not_utf8_decode_as_tiktoken(tok: Any, kimi_enc: Any) -> None:
    ids = tok.encode("中文😀", add_special_tokens=False)
    for n in range(1, len(ids) + 1):
        assert tok.decode(ids[:n]) == kimi_enc.decode(ids[:n])  # a cut character is U+FFFD in both


def test_special_tokens_ids_and_names(kimi_dir: tuple[Path, dict[bytes, int]], tok: Any) -> None:
    n = len(kimi_dir[1])
    specials = specials_of(n)
    assert len(specials) == RESERVED_SPECIAL_TOKENS + 2 and len(tok) == n + RESERVED_SPECIAL_TOKENS + 2
    assert {c: tok.convert_tokens_to_ids(c) for c in specials} == specials
    assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id, tok.pad_token_id) == (n, n + 1, n + 254, n + 255)
    assert tok.convert_tokens_to_ids("<|im_end|>") == n + 2 and tok.decode([n + 100]) == f"<|reserved_token_{n + 100}|>"
    assert tok.decode([n + 2, 72], skip_special_tokens=True) == "H"


@pytest.mark.parametrize("model_type", [None, "kimi_k2", "kimi_linear"])
def test_the_reserved_block_is_the_releases(kimi_dir: tuple[Path, dict[bytes, int]], tmp_path: Path,
                                            model_type: str | None) -> None:  # fmt: skip
    """Kimi-Linear's wrapper fills 258 ids past the ranks (163,842 beside 163,840 rows), the others 256: with only
    the block's own names in the config, the tokenizer has the release's count, each id recognised in text."""
    d = _copy(kimi_dir, tmp_path)
    n = len(kimi_dir[1])
    named = {off: c for off, c in NAMED.items() if off < 256}
    _edit_config(d, added_tokens_decoder=kimi_config(n, named)["added_tokens_decoder"])
    if model_type is not None:
        (d / "config.json").write_text(json.dumps({"model_type": model_type}))
    reserved = 258 if model_type == "kimi_linear" else 256
    tok = load_tiktoken_tokenizer(d, str(tmp_path / "cache"))
    assert len(tok) == n + reserved
    kimi_enc = reference_encoding(kimi_dir[1], specials_of(n, reserved, named))
    text = f"a<|reserved_token_{n + 257}|>b<|reserved_token_{n + 255}|>[PAD]"
    assert tok.encode(text, add_special_tokens=False) == reference_encode(kimi_enc, text)
    assert (n + 257 in tok.encode(text, add_special_tokens=False)) == (reserved == 258)


def test_chat_template_renders_kimis_markup(kimi_dir: tuple[Path, dict[bytes, int]], tok: Any, kimi_enc: Any) -> None:
    n = len(kimi_dir[1])
    msgs = [{"role": "user", "content": "Hello 中文 world"}, {"role": "assistant", "content": "Hi!"},
            {"role": "user", "content": "def f(): pass"}]  # fmt: skip
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_system|>system<|im_middle|>You are a helpful assistant.<|im_end|>"
        "<|im_user|>user<|im_middle|>Hello 中文 world<|im_end|><|im_assistant|>assistant<|im_middle|>Hi!<|im_end|>"
        "<|im_user|>user<|im_middle|>def f(): pass<|im_end|><|im_assistant|>assistant<|im_middle|>"
    )
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == reference_encode(kimi_enc, text)
    assert ids[0] == n + NAMED_ID["<|im_system|>"] and ids[-1] == n + NAMED_ID["<|im_middle|>"]


NAMED_ID = {c: off for off, c in NAMED.items()}


def test_streaming_detokenizer_rebuilds_the_text(tok: Any) -> None:
    from freetoken.engine.detokenizer import IncrementalDetokenizer

    text = "Hello 中文 😀 world\n  code()"
    ids = tok.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(tok, [], [], skip_special_tokens=True)
    out = "".join(d.add_token(t)[0] for t in ids) + d.flush()
    assert out == text


def test_a_token_marked_not_special_is_matched_whole_and_kept_on_decode(
    kimi_dir: tuple[Path, dict[bytes, int]], tmp_path: Path, kimi_enc: Any
) -> None:
    d = _copy(kimi_dir, tmp_path)
    n = len(kimi_dir[1])
    decoder = _config(d)["added_tokens_decoder"]
    decoder[str(n + 256)]["special"] = False  # <|media_begin|>
    _edit_config(d, added_tokens_decoder=decoder)
    tok = load_tiktoken_tokenizer(d, str(tmp_path / "cache"))
    text = "x <|media_begin|>[EOS]y"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == reference_encode(kimi_enc, text) and n + 256 in ids
    assert tok.decode(ids, skip_special_tokens=True) == "x <|media_begin|>y"


def test_chat_template_jinja_wins_over_the_configs(kimi_dir: tuple[Path, dict[bytes, int]], tmp_path: Path) -> None:
    d = _copy(kimi_dir, tmp_path)
    (d / "chat_template.jinja").write_text("{% for m in messages %}<|im_user|>{{ m['content'] }}{% endfor %}")
    tok = load_tiktoken_tokenizer(d, str(tmp_path / "cache"))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "<|im_user|>hi"


# ---- the cache ----------------------------------------------------------------------------------------------------


def test_cache_builds_once_then_hits(kimi_dir: tuple[Path, dict[bytes, int]], tmp_path: Path) -> None:
    d, cache = kimi_dir[0], str(tmp_path)
    first = converted_tokenizer(d, _config(d), cache)
    entry = cache_root(cache) / cache_key(d)
    assert first.source == "built" and (entry / JSON_FILE).read_text() == first.text
    again = converted_tokenizer(d, _config(d), cache)
    assert again.source == "hit" and again.text == first.text


@pytest.mark.parametrize("damage", ["truncate", "edit", "no_record", "bad_record"])
def test_a_damaged_cache_entry_is_rebuilt(kimi_dir: tuple[Path, dict[bytes, int]], tmp_path: Path,
                                          damage: str) -> None:  # fmt: skip
    d, cache = kimi_dir[0], str(tmp_path)
    good = converted_tokenizer(d, _config(d), cache).text
    entry = cache_root(cache) / cache_key(d)
    path = entry / JSON_FILE
    if damage == "truncate":
        path.write_text(good[: len(good) // 2])
    elif damage == "edit":  # still valid JSON, one merge's priority changed: a different tokenizer
        path.write_text(good.replace('"ignore_merges":true', '"ignore_merges":false'))
        assert path.read_text() != good
    elif damage == "no_record":
        (entry / HASH_FILE).unlink()
    else:
        (entry / HASH_FILE).write_text("0" * 64)
    rebuilt = converted_tokenizer(d, _config(d), cache)
    assert rebuilt.source == "built" and rebuilt.text == good and path.read_text() == good
    assert converted_tokenizer(d, _config(d), cache).source == "hit"


def test_a_changed_vocabulary_is_a_new_entry(kimi_dir: tuple[Path, dict[bytes, int]], tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    ranks = write_kimi_tokenizer(d)
    before = cache_key(d)
    assert before == cache_key(kimi_dir[0])  # same bytes, same key
    smaller = {t: r for t, r in ranks.items() if r < len(ranks) - 1}
    write_tiktoken_model(d / "tiktoken.model", smaller)
    (d / "tokenizer_config.json").write_text(json.dumps(kimi_config(len(smaller))))
    assert cache_key(d) != before
    tok = load_tiktoken_tokenizer(d, str(tmp_path / "cache"))
    assert len(tok) == len(smaller) + RESERVED_SPECIAL_TOKENS + 2


def test_an_unwritable_cache_still_loads(kimi_dir: tuple[Path, dict[bytes, int]], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    got = converted_tokenizer(kimi_dir[0], _config(kimi_dir[0]), str(blocker))
    assert got.source == "uncached" and json.loads(got.text)["model"]["type"] == "BPE"


def test_load_tokenizer_routes_and_caches_under_freetoken_cache(
    kimi_dir: tuple[Path, dict[bytes, int]], tmp_path: Path, freetoken_env: Any
) -> None:
    freetoken_env("FREETOKEN_CACHE", str(tmp_path))
    tok = load_tokenizer(kimi_dir[0])
    assert tok is not None and tok.chat_template and len(tok) == len(kimi_dir[1]) + RESERVED_SPECIAL_TOKENS + 2
    assert (tmp_path / "tokenizers" / cache_key(kimi_dir[0]) / JSON_FILE).exists()


# ---- refusals -----------------------------------------------------------------------------------------------------


def test_refusals(kimi_dir: tuple[Path, dict[bytes, int]], tmp_path: Path) -> None:
    d = _copy(kimi_dir, tmp_path)
    cache = str(tmp_path / "cache")
    n = len(kimi_dir[1])

    def refused(match: str) -> None:
        with pytest.raises(CheckpointError, match=match):
            load_tiktoken_tokenizer(d, cache)

    lines = (kimi_dir[0] / "tiktoken.model").read_text().splitlines()
    (d / "tiktoken.model").write_text("\n".join([*lines[:3], "!!notbase64 3", *lines[4:]]))
    refused(r"tiktoken.model:4: the token is not base64")
    (d / "tiktoken.model").write_text("\n".join(lines[:65] + lines[66:]))  # byte 0x41 gone
    refused(r"the ranks are not 0\.\.")
    (d / "tiktoken.model").write_text("\n".join(lines))
    _edit_config(d, auto_map={"AutoTokenizer": ["tokenization_other.Tok", None]})
    refused(r"auto_map.AutoTokenizer is .*tokenization_other")
    _edit_config(d, auto_map=kimi_config(n)["auto_map"], eos_token="<|nowhere|>")
    refused(r"eos_token '<\|nowhere\|>' is not a token")
    decoder = {**kimi_config(n)["added_tokens_decoder"], str(n - 1): {"content": "<|low|>", "special": True}}
    _edit_config(d, eos_token="[EOS]", added_tokens_decoder=decoder)
    refused(rf"added_tokens_decoder\['{n - 1}'\] .* has an id of the {n} BPE ranks")
    decoder = {**kimi_config(n)["added_tokens_decoder"], str(n + 40): {"content": "[EOS]", "special": True}}
    _edit_config(d, added_tokens_decoder=decoder)
    refused(rf"ids {n + 1} and {n + 40} are both the special token '\[EOS\]'")
    (d / "tokenizer_config.json").unlink()
    with pytest.raises(CheckpointError, match="has tiktoken.model but no tokenizer_config.json"):
        load_tokenizer(d)


def test_a_missing_byte_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    d.mkdir()
    ranks = {bytes([b]): i for i, b in enumerate(b for b in range(256) if b != 0x41)}
    write_tiktoken_model(d / "tiktoken.model", ranks)
    (d / "tokenizer_config.json").write_text(json.dumps(kimi_config(len(ranks))))
    with pytest.raises(CheckpointError, match="byte 0x41 has no rank"):
        load_tiktoken_tokenizer(d, str(tmp_path / "cache"))


def test_the_hub_download_fetches_tiktoken_model() -> None:
    repo = {"config.json": 1, "tiktoken.model": 2, "tokenizer_config.json": 3, "tokenization_kimi.py": 4}
    assert small_files(repo) == ["tokenizer_config.json", "tiktoken.model"]


# ---- grammars over a tokenizer larger than the model's vocabulary -------------------------------------------------


def test_grammar_with_ids_past_the_models_vocabulary(kimi_dir: tuple[Path, dict[bytes, int]], tok: Any) -> None:
    n = len(kimi_dir[1])
    vocab = n + RESERVED_SPECIAL_TOKENS  # the model's; the tokenizer has two more (<|media_begin|>, <|media_end|>)
    assert len(tok) == vocab + 2
    compiler = GrammarCompiler(tok, vocab, [tok.convert_tokens_to_ids("<|im_end|>")])
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
              "required": ["city", "days"], "additionalProperties": False}  # fmt: skip
    c = compiler.compile("start: %json " + json.dumps(schema))
    mask = new_bitmask(1, vocab)[0]
    for t in tok.encode('{"city": "Oslo 中", "days": 12}', add_special_tokens=False):
        c.fill_bitmask(mask)
        assert bool(allowed_tokens(mask, vocab)[t]) and c.accept(t)
    assert c.is_done()
    bad = compiler.compile("start: %json " + json.dumps(schema))
    bad.fill_bitmask(mask)
    assert not bool(allowed_tokens(mask, vocab)[tok.encode("x", add_special_tokens=False)[0]])


def test_a_narrower_model_mask_is_llguidances_cut_to_its_width(tok: Any) -> None:
    """A vocabulary of whole mask words (800 here) below the tokenizer's 814 ids: llguidance's mask has a word
    more; the model's is its first words, and the tokens past the vocabulary (a grammar may name them) are gone."""
    vocab = (len(tok) // 32) * 32
    assert bitmask_words(vocab) < bitmask_words(len(tok))
    grammar = 'start: "hello" " world" | <|media_begin|>'
    eos = [tok.convert_tokens_to_ids("<|im_end|>")]
    narrow = GrammarCompiler(tok, vocab, eos).compile(grammar)
    wide = GrammarCompiler(tok, len(tok), eos).compile(grammar)
    media = tok.convert_tokens_to_ids("<|media_begin|>")
    for step, text in enumerate(["hello", " world"]):
        m_narrow, m_wide = new_bitmask(1, vocab)[0], new_bitmask(1, len(tok))[0]
        narrow.fill_bitmask(m_narrow)
        wide.fill_bitmask(m_wide)
        assert torch.equal(m_narrow, m_wide[: bitmask_words(vocab)])
        assert bool(allowed_tokens(m_wide, len(tok))[media]) == (step == 0)
        t = tok.encode(text, add_special_tokens=False)
        assert all(narrow.accept(i) and wide.accept(i) for i in t)
    assert narrow.is_done() and wide.is_done()


def test_llguidance_gets_the_tokenizer_without_the_chunk_cut(tok: Any) -> None:
    full = json.loads(tok.backend_tokenizer.to_str())["pre_tokenizer"]["pretokenizers"]
    cut = json.loads(without_chunk_cut(tok.backend_tokenizer.to_str()))["pre_tokenizer"]["pretokenizers"]
    assert len(full) == 4 and cut == full[1:]
