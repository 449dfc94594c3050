"""Real agent clients against the real ``ft serve`` app on loopback, each run non-interactively on a task, pointed
at the server by ``ft launch``'s own plans (src/freetoken/launch/), in a throw-away HOME and work folder. Two tasks:
``READ`` ("read numbers.txt and answer with the number in it": a tool's output must come back) and ``HELLO`` (create
hello.py that prints hi, in a fresh git repository: the client's own write tool must run).

The server is the real HTTP app (``freetoken.bench.loopback.serve``) with a recorder around it that keeps
every request body and every error answer, for the facts (API, tools, first request's size, errors).
The engine behind it is either the scripted one (tests/clients/scripted.py: proves the wiring today) or
a real model (``--model PATH``, or ``--model default`` for the embedded default model).

    PYTHONPATH=src:tests python3 tests/clients/harness.py --model scripted           # every client, scripted
    PYTHONPATH=src:tests python3 tests/clients/harness.py --model default claude     # the embedded model
    PYTHONPATH=src:tests python3 tests/clients/harness.py --task hello               # create hello.py
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import client_install

from freetoken.bench.loopback import Running, serve
from freetoken.launch import base
from freetoken.launch import claude as claude_launch
from freetoken.launch import codex as codex_launch
from freetoken.launch import hermes as hermes_launch
from freetoken.launch import openclaw as openclaw_launch
from freetoken.launch import opencode as opencode_launch
from freetoken.server.settings import ServerConfig

MODEL = "freetoken"
NUMBER = "73914"
PROMPT = "Read the file numbers.txt and answer with the number in it."
HELLO_PROMPT = "Create a file hello.py in this folder that prints hi when run with python3."
CLIENT_TIMEOUT_S = 180


@dataclass(frozen=True)
class Task:
    name: str
    prompt: str
    writes: bool  # the client must be allowed to write in its work folder
    git: bool = False  # the work folder is a fresh git repository


READ = Task("read", PROMPT, writes=False)
HELLO = Task("hello", HELLO_PROMPT, writes=True, git=True)
TASKS = (READ, HELLO)


@dataclass
class Exchange:
    path: str
    body: Any
    status: int = 0
    error: bytes = b""  # the answer's body when status >= 400


@dataclass
class Recorder:
    """ASGI middleware: keeps each POST's JSON body, its status, and the body of error answers."""

    exchanges: list[Exchange] = field(default_factory=list)

    def wrap(self, app: Any) -> Any:
        async def recorded(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http" or scope["method"] != "POST":
                return await app(scope, receive, send)
            chunks: list[bytes] = []
            more = True
            while more:
                msg = await receive()
                chunks.append(msg.get("body", b""))
                more = msg.get("more_body", False)
            raw = b"".join(chunks)
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw[:200]
            ex = Exchange(scope["path"], body)
            self.exchanges.append(ex)
            replayed = False

            async def replay() -> dict[str, Any]:
                nonlocal replayed
                if replayed:
                    return await receive()  # disconnect notices
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}

            async def watch(msg: dict[str, Any]) -> None:
                if msg["type"] == "http.response.start":
                    ex.status = msg["status"]
                elif msg["type"] == "http.response.body" and ex.status >= 400:
                    ex.error += msg.get("body", b"")
                await send(msg)

            await app(scope, replay, watch)

        return recorded


@dataclass(frozen=True)
class Client:
    name: str
    launch: Any  # the ft launch module (plan(), BINARY)
    args: Callable[[str, bool], list[str]]  # (prompt, may write) -> the arguments after those of the launch plan
    env: Mapping[str, str] = field(default_factory=dict)


CLIENTS: dict[str, Client] = {
    c.name: c
    for c in (
        # -p: print mode; Read (and Write where the task writes) allowed without a prompt (root may not skip
        # permissions altogether).
        Client("claude", claude_launch, lambda p, w: ["-p", p, "--allowedTools", "Read,Write" if w else "Read"]),
        # exec: one task; its shell tool runs in Codex's sandbox (its bundled bubblewrap): read-only, or the work folder
        # writable.
        Client("codex", codex_launch,
               lambda p, w: ["exec", "--skip-git-repo-check", "--sandbox", "workspace-write" if w else "read-only", p]),
        Client(
            "opencode",
            opencode_launch,
            lambda p, w: ["run", p],
            # models.dev (its model catalogue) is not npm: never asked; our model's limits come from the config.
            env={"OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1"},
        ),
        # -z: one shot (prompt in, final text out; approvals bypassed).
        Client("hermes", hermes_launch, lambda p, w: ["-z", p]),
        # agent --local: one turn of the embedded agent, no gateway.
        Client("openclaw", openclaw_launch, lambda p, w: ["agent", "--local", "--message", p]),
    )
}
# opencode wants its provider package (@ai-sdk/openai-compatible) from npm at first use: one shared cache.
SHARED_CACHE = ("opencode",)


@dataclass
class Outcome:
    client: str
    rc: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float
    exchanges: list[Exchange]
    work: Path  # the client's work folder

    @property
    def answered(self) -> bool:
        return self.rc == 0 and NUMBER in self.stdout

    def hello_prints(self) -> str | None:
        """What ``python3 hello.py`` prints in the work folder (None: no hello.py, or it failed)."""
        if not (self.work / "hello.py").is_file():
            return None
        run = subprocess.run([sys.executable, "hello.py"], cwd=self.work, capture_output=True, text=True, timeout=30)
        return run.stdout if run.returncode == 0 else None

    def describe(self) -> str:
        rc = "timed out" if self.rc is None else f"exit {self.rc}"
        tail = (self.stdout.strip() or self.stderr.strip())[-600:]
        paths = ", ".join(f"{e.path} {e.status}" for e in self.exchanges[:12])
        return f"{self.client}: {rc} after {self.seconds:.1f} s; requests: [{paths}]; output: {tail!r}"


def workspace(root: Path, task: Task = READ) -> tuple[Path, Path]:
    """A work folder holding numbers.txt (a fresh git repository where the task asks for one), and an empty HOME."""
    work, home = root / "work", root / "home"
    work.mkdir(parents=True)
    home.mkdir()
    (work / "numbers.txt").write_text(NUMBER + "\n")
    if task.git:
        subprocess.run(["git", "init", "-q", str(work)], check=True)
    return work, home


def client_env(
    client: Client, url: str, home: Path, bin_dir: Path, model: str | None = MODEL, key: str = base.API_KEY,
    task: Task = READ,
) -> tuple[list[str], dict[str, str]]:  # fmt: skip
    """The command line and environment ``ft launch <client>`` would run, files written into ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "CODEX_", "OPENCODE_"))}
    env.update(HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", NO_PROXY="127.0.0.1,localhost")
    env.update({"XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local/share")})
    env["XDG_CACHE_HOME"] = str(client_install.prefix() / "xdg-cache") if client.name in SHARED_CACHE else ""
    env = {k: v for k, v in env.items() if v}
    server = base.probe_server(url, model, key=key)
    plan = client.launch.plan(server, env, client.args(task.prompt, task.writes))
    base.apply_plan(plan)
    return [str(bin_dir / plan.binary), *plan.args], {**plan.child_env(env), **client.env}


def run_client(
    client: Client, running: Running | str, recorder: Recorder, root: Path, bin_dir: Path, timeout: float,
    key: str = base.API_KEY, task: Task = READ,
) -> Outcome:  # fmt: skip
    """``running``: our server, or the URL of an ``ft serve`` started elsewhere (its first model is used); ``key``:
    what ``ft launch`` is given as ``--api-key``."""
    work, home = workspace(root, task)
    url = running if isinstance(running, str) else running.url
    cmd, env = client_env(client, url, home, bin_dir, None if isinstance(running, str) else MODEL, key, task)
    env["PWD"] = str(work)  # opencode takes its project folder from $PWD, not from the process's cwd
    if not isinstance(running, str) and hasattr(running.engine, "workdir"):
        running.engine.workdir = str(work)  # the scripted model's tool calls name this folder
    first = len(recorder.exchanges)
    t0 = time.monotonic()
    # A session of its own: at the timeout the client and everything it started (shells, servers) are killed.
    proc = subprocess.Popen(
        cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_session(proc.pid)
        out, err = proc.communicate()
        rc = None
    _kill_session(proc.pid)  # what the client left running
    return Outcome(client.name, rc, out, err, time.monotonic() - t0, recorder.exchanges[first:], work)


def _kill_session(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextmanager
def server(
    model: str, tmp: Path, max_model_len: int | None = None, api_key: str | None = None
) -> Iterator[tuple[Running, Recorder]]:
    """``model``: "scripted", "default" (the embedded model) or a checkpoint path; ``max_model_len`` (scripted
    only, in its toy tokenizer's tokens): a context to overflow; ``api_key``: the key the server checks."""
    recorder = Recorder()
    engine: Any
    if model == "scripted":
        import scripted

        engine = scripted.engine(str(tmp / "tok"), max_model_len or scripted.MAX_MODEL_LEN)
    else:
        from freetoken.config import EngineConfig
        from freetoken.engine.async_llm import AsyncLLM

        cfg = EngineConfig(model=None if model == "default" else model, device="cpu", seed=0)  # the seed fixed

        def engine() -> Any:
            return AsyncLLM.start(cfg)

    with serve(engine, ServerConfig(served_model_names=(MODEL,), api_key=api_key), wrap=recorder.wrap) as running:
        yield running, recorder


def facts(outcome: Outcome, url: str) -> dict[str, Any]:
    """What the client sent first and how the server answered it (for docs/agents.md); an Anthropic request's
    size in tokens is asked of the server's count_tokens (its refusal may give only a lower bound)."""
    main = next((e for e in outcome.exchanges if isinstance(e.body, dict) and e.body.get("tools")), None)
    out: dict[str, Any] = {"client": outcome.client, "rc": outcome.rc, "seconds": round(outcome.seconds, 1)}
    out["requests"] = [f"{e.path} {e.status}" for e in outcome.exchanges]
    if main is not None:
        tools = main.body["tools"]
        out.update(path=main.path, tools=len(tools), tool_schema_chars=len(json.dumps(tools)))
        out["request_chars"] = len(json.dumps(main.body))
        out["error"] = main.error.decode("utf-8", "replace")[:400]
        if main.path == "/v1/messages":
            import httpx

            counted = httpx.post(url + "/v1/messages/count_tokens", json=main.body, timeout=60).json()
            out["input_tokens"] = counted.get("input_tokens")
    out["output"] = (outcome.stdout.strip() + "\n" + outcome.stderr.strip()).strip()[-800:]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("clients", nargs="*", default=list(CLIENTS), help="clients to run (default: all)")
    p.add_argument("--model", default="scripted", help="scripted | default | a checkpoint path")
    p.add_argument("--timeout", type=float, default=CLIENT_TIMEOUT_S, help="seconds per client run")
    p.add_argument("--max-model-len", type=int, default=None, help="the scripted model's context (toy tokens)")
    p.add_argument("--dump", type=Path, default=None, help="write each client's requests to DUMP/<client>.json")
    p.add_argument("--url", default=None, help="an `ft serve` already running (no requests recorded then)")
    p.add_argument("--task", choices=[t.name for t in TASKS], default=READ.name, help="what each client is asked")
    p.add_argument("--runs", type=int, default=1, help="runs per client (a table of successes follows them)")
    args = p.parse_args(argv)
    task = next(t for t in TASKS if t.name == args.task)
    dirs = client_install.bin_dirs(args.clients)
    tally: dict[str, list[tuple[bool, int, float]]] = {}  # client -> (succeeded, requests, seconds) per run
    with ExitStack() as stack:
        d = stack.enter_context(tempfile.TemporaryDirectory(prefix="ft-clients-"))
        if args.url:
            running: Running | str = base.normalize_server_url(args.url)
            rec = Recorder()
        else:
            running, rec = stack.enter_context(server(args.model, Path(d), args.max_model_len))
        url = running if isinstance(running, str) else running.url
        for run in range(args.runs):
            for name in args.clients:
                root = Path(d) / f"{name}-{run}"
                outcome = run_client(CLIENTS[name], running, rec, root, dirs[name], args.timeout, task=task)
                print(json.dumps(facts(outcome, url), indent=1), flush=True)
                ok = outcome.answered if task is READ else outcome.rc == 0 and outcome.hello_prints() == "hi\n"
                tally.setdefault(name, []).append((ok, len(outcome.exchanges), outcome.seconds))
                if args.dump:
                    args.dump.mkdir(parents=True, exist_ok=True)
                    dumped = [{"path": e.path, "status": e.status, "body": e.body} for e in outcome.exchanges]
                    (args.dump / f"{name}-{run}.json").write_text(json.dumps(dumped, indent=1, default=str))
    print(f"\n| client | {task.name}: succeeded | requests (most) | seconds (median) |\n|---|---|---|---|")
    for name, rows in tally.items():
        secs = sorted(r[2] for r in rows)
        print(f"| {name} | {sum(r[0] for r in rows)} of {len(rows)} | {max(r[1] for r in rows)} | "
              f"{secs[len(secs) // 2]:.1f} |")
    ok = all(r[0] for rows in tally.values() for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
