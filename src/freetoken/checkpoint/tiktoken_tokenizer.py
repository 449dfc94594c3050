"""A checkpoint's ``tiktoken.model`` (one ``<base64 token bytes> <rank>`` line per token) converted into a Hugging Face
``tokenizers`` byte-level BPE that encodes and decodes as the checkpoint's own tiktoken wrapper does.

The wrapper is Python shipped with the checkpoint (Kimi's ``tokenization_kimi.TikTokenTokenizer``), never imported:
what it does is written down here instead, keyed by the module ``tokenizer_config.json``'s ``auto_map`` names.
- Pre-tokenizer: its regex (``KIMI_PATTERN``), applied by the converted tokenizer as tiktoken applies it.
- Special tokens: the ids right above the ``n`` BPE ranks are control tokens, named by ``added_tokens_decoder``
  where it names them and ``<|reserved_token_{id}|>`` elsewhere; every one is recognised in text
  (tiktoken's ``allowed_special="all"``). The block is 256 ids, 258 in Kimi-Linear's release (its wrapper fills two
  more: 163,842 ids beside the model's 163,840 rows; told by ``config.json``'s ``model_type``). Ids
  ``added_tokens_decoder`` names past the block are added too, with the gap between filled the same way.
- Runs: the wrapper cuts text into 400,000-character chunks and each chunk's runs of whitespace (``str.isspace``)
  or non-whitespace into 25,000-character pieces before tiktoken sees it (a cut changes the tokens at the seam).
  Two ``Split`` pre-tokenizers ahead of the regex make the same cuts (``\\G`` anchors a match where the last ended).

Merges: every split of a token into two ranked halves, ordered by the token's rank, and ``ignore_merges`` (a piece
that is a token is that token, as tiktoken looks a piece up before merging it).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freetoken.checkpoint.errors import CheckpointError

TIKTOKEN_FILE = "tiktoken.model"
CONFIG_FILE = "tokenizer_config.json"
RESERVED_SPECIAL_TOKENS = 256  # the control-token block above the BPE ranks (the wrapper's class attribute)
RESERVED_BY_MODEL_TYPE = {"kimi_linear": RESERVED_SPECIAL_TOKENS + 2}  # releases whose wrapper fills more
CHUNK_CHARS = 400_000  # the wrapper's TIKTOKEN_MAX_ENCODE_CHARS
RUN_CHARS = 25_000  # the wrapper's MAX_NO_WHITESPACES_CHARS

_KIMI_LETTER_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_KIMI_LETTER_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
KIMI_PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        rf"[^\r\n\p{{L}}\p{{N}}]?{_KIMI_LETTER_UPPER}*{_KIMI_LETTER_LOWER}+{_CONTRACTIONS}",
        rf"[^\r\n\p{{L}}\p{{N}}]?{_KIMI_LETTER_UPPER}+{_KIMI_LETTER_LOWER}*{_CONTRACTIONS}",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
PATTERNS = {"tokenization_kimi": KIMI_PATTERN}  # the wrapper's module (``auto_map``) → its pre-tokenizer regex

# Python's str.isspace(), which the wrapper's run cut uses: Unicode White_Space plus the separators U+1C..U+1F
# (tests/test_tiktoken_tokenizer.py checks this against every code point).
ISSPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + "\u2028\u2029\u202f\u205f\u3000"
)


@dataclass(frozen=True)
class TiktokenSpec:
    """What the conversion reads: the BPE ranks, the special tokens by id, the pre-tokenizer regex."""

    ranks: dict[bytes, int]
    specials: dict[int, str]
    pattern: str
    plain: frozenset[int] = frozenset()  # ids ``added_tokens_decoder`` marks ``"special": false`` (kept on decode)


def read_ranks(path: Path) -> dict[bytes, int]:
    """``tiktoken.model``'s ranks, checked: base64 tokens, ranks 0..n-1 each once, every single byte ranked."""
    ranks: dict[bytes, int] = {}
    for n, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2 or not fields[1].isdigit():
            raise CheckpointError(f"{path}:{n}: expected '<base64 token> <rank>', got {line[:60]!r}")
        try:
            token = base64.b64decode(fields[0], validate=True)
        except (binascii.Error, ValueError) as e:
            raise CheckpointError(f"{path}:{n}: the token is not base64 ({e})") from e
        if token in ranks:
            raise CheckpointError(f"{path}:{n}: token {token!r} is ranked twice")
        ranks[token] = int(fields[1])
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise CheckpointError(f"{path}: the ranks are not 0..{len(ranks) - 1}, each once")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise CheckpointError(f"{path}: byte 0x{missing[0]:02x} has no rank, so some text could not be encoded")
    return ranks


def reserved_tokens(directory: Path) -> int:
    """The control-token block's size for the checkpoint in ``directory``: by ``config.json``'s ``model_type``
    (a directory with the tokenizer files alone: the default)."""
    try:
        model_type = json.loads((directory / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):  # no config.json: the model loader speaks for a bad one
        return RESERVED_SPECIAL_TOKENS
    return RESERVED_BY_MODEL_TYPE.get(str(model_type), RESERVED_SPECIAL_TOKENS)


def read_spec(directory: Path, config: Mapping[str, Any], reserved: int | None = None) -> TiktokenSpec:
    """The conversion's input from a checkpoint directory and its parsed ``tokenizer_config.json``."""
    ranks = read_ranks(directory / TIKTOKEN_FILE)
    block = reserved_tokens(directory) if reserved is None else reserved
    specials = special_tokens(config, len(ranks), block, str(directory / CONFIG_FILE))
    decoder = config.get("added_tokens_decoder") or {}
    plain = frozenset(int(k) for k, v in decoder.items() if isinstance(v, Mapping) and v.get("special") is False)
    return TiktokenSpec(ranks, specials, pattern_of(config), plain)


def pattern_of(config: Mapping[str, Any]) -> str:
    """The pre-tokenizer regex of the wrapper ``auto_map`` names (``tokenization_kimi.TikTokenTokenizer``)."""
    auto = config.get("auto_map") or {}
    entry = auto.get("AutoTokenizer") if isinstance(auto, Mapping) else None
    names = [e for e in (entry if isinstance(entry, list) else [entry]) if isinstance(e, str)]
    for name in names:
        module = name.rsplit(".", 1)[0].split("--")[-1]  # "repo--module.Class" form too
        if module in PATTERNS:
            return PATTERNS[module]
    raise CheckpointError(
        f"{CONFIG_FILE}: auto_map.AutoTokenizer is {entry!r}; the pre-tokenizer of a tiktoken.model is known only "
        f"for {sorted(PATTERNS)}"
    )


def special_tokens(
    config: Mapping[str, Any], n_base: int, reserved: int = RESERVED_SPECIAL_TOKENS, what: str = CONFIG_FILE
) -> dict[int, str]:
    """Id → content of every special token: ``added_tokens_decoder``'s, the reserved fill in between."""
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, Mapping):
        raise CheckpointError(f"{what}: added_tokens_decoder is not an object")
    named: dict[int, str] = {}
    for key, entry in decoder.items():
        content = entry.get("content") if isinstance(entry, Mapping) else entry
        if not str(key).isdigit() or not isinstance(content, str) or not content:
            raise CheckpointError(f"{what}: added_tokens_decoder[{key!r}] is not an id with a content")
        tid = int(key)
        if tid < n_base:
            raise CheckpointError(
                f"{what}: added_tokens_decoder[{key!r}] ({content!r}) has an id of the {n_base} BPE ranks of "
                f"{TIKTOKEN_FILE}; special tokens start at {n_base}"
            )
        named[tid] = content
    end = max([n_base + reserved, *(t + 1 for t in named)])
    specials = {t: named.get(t, f"<|reserved_token_{t}|>") for t in range(n_base, end)}
    seen: dict[str, int] = {}
    for tid, content in specials.items():
        if content in seen:
            raise CheckpointError(f"{what}: ids {seen[content]} and {tid} are both the special token {content!r}")
        seen[content] = tid
    return specials


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, the alphabet of byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


def bpe_vocab_and_merges(ranks: Mapping[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The byte-level vocabulary and the merges that rebuild every multi-byte token, in the token's rank order."""
    table = byte_to_unicode()

    def text(token: bytes) -> str:
        return "".join(table[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    found: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                found.append((rank, ranks[left], ranks[right], left, right))
    found.sort()
    return vocab, [(text(a), text(b)) for _, _, _, a, b in found]


def _class(chars: str, negate: bool) -> str:
    return "[" + ("^" if negate else "") + "".join(f"\\x{{{ord(c):x}}}" for c in chars) + "]"


def run_cut_pattern(run: int = RUN_CHARS) -> str:
    """Matches ``run`` characters of one class (whitespace or not) where the run goes on: the wrapper cuts there.
    A match starts where the last one ended (``\\G``) or where a run starts, so a run is cut every ``run``
    characters from its start, and each try fails within one run (no quadratic rescans)."""
    space, other = _class(ISSPACE, False), _class(ISSPACE, True)
    return "|".join(f"(?:\\G|(?<!{c})){c}{{{run}}}(?={c})" for c in (space, other))


def chunk_pattern(chunk: int = CHUNK_CHARS) -> str:
    """Matches the next ``chunk`` characters from where the last chunk ended (Oniguruma repeats at most 100,000)."""
    step = 100_000 if chunk % 100_000 == 0 else chunk
    return f"\\G(?:[\\s\\S]{{{step}}}){{{chunk // step}}}"


def build_tokenizer(spec: TiktokenSpec) -> Any:
    """The ``tokenizers.Tokenizer`` equivalent of ``spec`` (a few seconds for a 160k vocabulary)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab, merges = bpe_vocab_and_merges(spec.ranks)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(chunk_pattern()), behavior="isolated"),
            pre_tokenizers.Split(Regex(run_cut_pattern()), behavior="merged_with_previous"),
            pre_tokenizers.Split(Regex(spec.pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    for tid, content in sorted(spec.specials.items()):  # each takes the next id: the ids run on from the ranks
        if tid in spec.plain:  # still matched whole in text (tiktoken's allowed_special="all"), kept on decode
            tok.add_tokens([AddedToken(content, special=False, normalized=False)])
        else:
            tok.add_special_tokens([AddedToken(content, special=True, normalized=False)])
        if tok.token_to_id(content) != tid:  # a special token spelled like a BPE token would take that token's id
            raise CheckpointError(f"{CONFIG_FILE}: special token {content!r} (id {tid}) is also a BPE token")
    return tok


def without_chunk_cut(tokenizer_json: str) -> str:
    """``tokenizer_json`` without the 400,000-character chunk cut, for consumers whose regex engine cannot build a
    400,000-fold repeat (llguidance compiles the pre-tokenizer into an NFA): they tokenize short strings only, which
    the cut never touches. Other tokenizers come back unchanged."""
    doc = json.loads(tokenizer_json)
    pre = doc.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps:
        return tokenizer_json
    cut = chunk_pattern()
    kept = [s for s in steps if not (s.get("type") == "Split" and (s.get("pattern") or {}).get("Regex") == cut)]
    if len(kept) == len(steps):
        return tokenizer_json
    pre["pretokenizers"] = kept
    return json.dumps(doc, ensure_ascii=False)
