"""What v2 takes from v1 besides its modules (which v2 imports as ``training.default_model.<name>``): the
tokenizer v1 trained, which v2 keeps."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
V1_TOKENIZER = ROOT / "src" / "freetoken" / "assets" / "default_model" / "tokenizer.json"
