"""Build C++ ops on first use and cache the shared libraries per machine (no torch headers, no build step at
install time: DESIGN §5).

A library lives under ``env().cache_dir/kernels/`` in a folder named by a hash of its sources, the compiler's
version, the machine and the flags, so a source edit or a new compiler rebuilds and several processes may share one
build (a file lock keeps them from building it twice at once). Two shapes: ``single_source_library`` (one .cpp, the
small CPU ops) and ``library_path`` for a ``CppLibrary`` of several translation units where each ISA path is its own
unit with its own ``-m`` flags; a path the compiler cannot build is left out and the run-time dispatch never picks it
(the CPU expert kernel, ``experts/cpu/sources.py``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from freetoken.config import env

AVX2_FLAGS = ("-mavx2", "-mfma", "-mf16c")  # F16C: fp8 weights widen through fp16
AVX512_FLAGS = (*AVX2_FLAGS, "-mavx512f", "-mavx512bw", "-mavx512vl")
BASE_FLAGS = ("-std=c++17", "-O3", "-fPIC", "-pthread", "-fno-math-errno")


@dataclass(frozen=True)
class CppLibrary:
    """A shared library of several translation units in one folder."""

    name: str  # the cache folder's prefix
    src_dir: Path
    lib_name: str  # the .so file
    headers: tuple[str, ...]
    core_sources: tuple[str, ...]  # always built (the dispatch source among them, compiled last)
    dispatch_source: str  # compiled with the FT_HAVE_<ISA> macros of the ISA units that built
    isa_sources: Mapping[str, tuple[tuple[str, ...], str]]  # ISA unit -> (its -m flags, its FT_HAVE_<ISA> macro)


class BuildError(RuntimeError):
    pass


def find_compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def build_key(cxx: str, spec: CppLibrary) -> str:
    """Hash of everything the library depends on: sources, compiler version, machine, flags."""
    h = hashlib.sha256()
    for name in (*spec.headers, *spec.core_sources, *spec.isa_sources):
        h.update(name.encode())
        h.update((spec.src_dir / name).read_bytes())
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    h.update(version.encode())
    h.update(f"{platform.machine()}|{platform.system()}|{BASE_FLAGS}|{dict(spec.isa_sources)}".encode())
    return h.hexdigest()[:16]


def _compile(cxx: str, src: Path, flags: tuple[str, ...], obj: Path) -> tuple[bool, str]:
    cmd = [cxx, *BASE_FLAGS, *flags, "-c", str(src), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return proc.returncode == 0, proc.stderr[-2000:]


def _build_into(cxx: str, spec: CppLibrary, out_dir: Path) -> None:
    """Compile every TU in parallel (dropping ISA ones that fail), then the dispatch source, and link."""
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as tmp:
        tmpd, at = Path(tmp), spec.src_dir
        isa = spec.isa_sources if _is_x86() else {}
        jobs = {src: flags for src, (flags, _) in isa.items()}
        jobs.update({src: () for src in spec.core_sources if src != spec.dispatch_source})
        with ThreadPoolExecutor(max_workers=len(jobs)) as ex:
            futs = {src: ex.submit(_compile, cxx, at / src, fl, tmpd / f"{src}.o") for src, fl in jobs.items()}
            results = {src: fut.result() for src, fut in futs.items()}
        for src, (ok, err) in results.items():
            if not ok and src not in isa:
                raise BuildError(f"compiling {src} failed:\n{err}")
        built = [src for src in isa if results[src][0]]
        # the dispatcher learns which ISA paths exist from FT_HAVE_<ISA> macros
        macros = tuple(f"-D{isa[s][1]}" for s in built)
        ok, err = _compile(cxx, at / spec.dispatch_source, macros, tmpd / "k.o")
        if not ok:
            raise BuildError(f"compiling {spec.dispatch_source} failed:\n{err}")
        objs = [tmpd / f"{src}.o" for src in results if results[src][0]] + [tmpd / "k.o"]
        lib_tmp = tmpd / spec.lib_name
        cmd = [cxx, "-shared", "-pthread", *map(str, objs), "-o", str(lib_tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BuildError(f"linking failed:\n{proc.stderr[-2000:]}")
        os.replace(lib_tmp, out_dir / spec.lib_name)  # atomic: readers never see a half-written file


def library_path(spec: CppLibrary, cache_dir: str | None = None) -> Path:
    """Path of ``spec``'s built library, building it first when needed. Raises BuildError."""
    cxx = _compiler()
    out_dir = Path(cache_dir or env().cache_dir) / "kernels" / f"{spec.name}-{build_key(cxx, spec)}"
    return _built_once(out_dir / spec.lib_name, lambda: _build_into(cxx, spec, out_dir))


def single_source_library(src: Path, lib_name: str, flags: tuple[str, ...] = ()) -> Path:
    """A shared library of one C++ source (the small CPU ops), built on first use and cached like a ``CppLibrary``'s:
    by a hash of the source, the compiler's version, the machine and the flags. Raises BuildError."""
    cxx = _compiler()
    h = hashlib.sha256(src.read_bytes())
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    h.update(f"{version}|{platform.machine()}|{platform.system()}|{BASE_FLAGS}|{flags}".encode())
    out_dir = Path(env().cache_dir) / "kernels" / f"{src.stem}-{h.hexdigest()[:16]}"

    def build() -> None:
        with tempfile.TemporaryDirectory(dir=out_dir.parent) as tmp:
            lib_tmp = Path(tmp) / lib_name
            cmd = [cxx, *BASE_FLAGS, *flags, "-shared", str(src), "-o", str(lib_tmp)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise BuildError(f"compiling {src.name} failed:\n{proc.stderr[-2000:]}")
            os.replace(lib_tmp, out_dir / lib_name)

    return _built_once(out_dir / lib_name, build)


def _compiler() -> str:
    cxx = find_compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found (tried $CXX, c++, g++, clang++)")
    return cxx


def _built_once(lib: Path, build: Callable[[], None]) -> Path:
    """``lib``, built by ``build`` unless it exists; a file lock keeps processes from building it twice at once."""
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    with open(lib.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same key
        try:
            if not lib.exists():
                build()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return lib
