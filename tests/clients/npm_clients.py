"""Install the agent clients, pinned, into a project-local npm prefix (never global), once per version set.

The prefix is ``$FT_CLIENTS_DIR`` (default ``~/.cache/freetoken/clients``). Every package comes from the npm
registry; their native binaries arrive as the packages' own optionalDependencies (``*-linux-x64``), so no
install script has to run (npm 11 does not run them unless allowed, and the clients work without them).
Run as a script to install: ``python3 tests/clients/npm_clients.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

# The versions the launch modules' notes were measured with (src/freetoken/launch/*.py).
NPM_PACKAGES = {
    "@anthropic-ai/claude-code": "2.1.197",
    "@openai/codex": "0.171.0",
    "opencode-ai": "1.18.33",
}
INSTALL_TIMEOUT_S = 600


def prefix() -> Path:
    default = Path.home() / ".cache" / "freetoken" / "clients"
    return Path(os.environ.get("FT_CLIENTS_DIR") or default)


def bin_dir() -> Path:
    return prefix() / "node_modules" / ".bin"


def _stamp() -> str:
    return json.dumps(NPM_PACKAGES, sort_keys=True)


def install() -> Path:
    """The ``.bin`` folder holding ``claude``, ``codex`` and ``opencode``; installs them if missing or stale."""
    root = prefix()
    stamp = root / "installed.json"
    if stamp.is_file() and stamp.read_text() == _stamp() and all((bin_dir() / b).exists() for b in BINARIES):
        return bin_dir()
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not on PATH: install Node.js 20+ (Debian: apt-get install nodejs npm)")
    root.mkdir(parents=True, exist_ok=True)
    specs = [f"{name}@{version}" for name, version in NPM_PACKAGES.items()]
    cmd = [npm, "install", "--prefix", str(root), "--no-fund", "--no-audit", "--save-exact", *specs]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"npm install failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    missing = [b for b in BINARIES if not (bin_dir() / b).exists()]
    if missing:
        raise RuntimeError(f"npm install left no {', '.join(missing)} in {bin_dir()}")
    stamp.write_text(_stamp())
    return bin_dir()


BINARIES = ("claude", "codex", "opencode")

if __name__ == "__main__":
    print(install())
    sys.exit(0)
