"""v1's training modules, reused by v2: v1's folder goes on sys.path (its modules import each other by bare
name), and the few v1 modules whose names v2 also uses (train, evaluate) load under a v1_ prefix."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

V1_DIR = Path(__file__).resolve().parents[1] / "default_model"
ROOT = V1_DIR.parents[1]
V1_TOKENIZER = ROOT / "src" / "freetoken" / "assets" / "default_model" / "tokenizer.json"
if str(V1_DIR) not in sys.path:
    sys.path.insert(1, str(V1_DIR))


def load(name: str) -> ModuleType:
    """v1's module `name` (e.g. "train") as `v1_<name>`, loaded once."""
    key = f"v1_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, V1_DIR / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]
