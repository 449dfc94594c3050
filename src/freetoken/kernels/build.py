"""Build the CPU expert kernel on first use and cache the shared library per machine.

The .so lives under ``env().cache_dir/kernels/`` in a folder named by a hash of the sources, the
compiler's version, the machine and the flags, so a source edit or a new compiler rebuilds and
several processes may share one build (a file lock keeps them from building it twice at once).
Each ISA path is its own translation unit with its own ``-m`` flags; a path the compiler cannot
build is left out and the run-time dispatch never picks it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from freetoken.config import env

SRC_DIR = Path(__file__).resolve().parent
HEADERS = (
    "kernel_api.h", "plan.h", "workers.h", "feeder.h", "job_queue.h", "relax.h", "flag_wait.h", "dot_impl.h",
    "dot_rows.h", "isa_avx512_s.h",
)  # fmt: skip
CORE_SOURCES = ("kernel.cpp", "plan.cpp", "workers.cpp", "feeder.cpp", "isa_generic.cpp")
DISPATCH_SOURCE = "kernel.cpp"  # compiled last, with the FT_HAVE_<ISA> macros of the paths that built
_AVX2 = ("-mavx2", "-mfma", "-mf16c")  # F16C: fp8 weights widen through fp16
_AVX512 = (*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl")
# ISA translation unit -> (its -m flags, the macro that tells kernel.cpp it was built)
ISA_SOURCES: dict[str, tuple[tuple[str, ...], str]] = {
    "isa_avx2.cpp": (_AVX2, "FT_HAVE_AVX2"),
    "isa_avx512.cpp": (_AVX512, "FT_HAVE_AVX512"),
    "isa_avx512bf16.cpp": ((*_AVX512, "-mavx512bf16"), "FT_HAVE_AVX512BF16"),
}
BASE_FLAGS = ("-std=c++17", "-O3", "-fPIC", "-pthread", "-fno-math-errno")
LIB_NAME = "libft_cpu_experts.so"


class BuildError(RuntimeError):
    pass


def find_compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def build_key(cxx: str) -> str:
    """Hash of everything the library depends on: sources, compiler version, machine, flags."""
    h = hashlib.sha256()
    for name in (*HEADERS, *CORE_SOURCES, *ISA_SOURCES):
        h.update(name.encode())
        h.update((SRC_DIR / name).read_bytes())
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    h.update(version.encode())
    h.update(f"{platform.machine()}|{platform.system()}|{BASE_FLAGS}|{ISA_SOURCES}".encode())
    return h.hexdigest()[:16]


def _compile(cxx: str, src: str, flags: tuple[str, ...], obj: Path) -> tuple[bool, str]:
    cmd = [cxx, *BASE_FLAGS, *flags, "-c", str(SRC_DIR / src), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return proc.returncode == 0, proc.stderr[-2000:]


def _build_into(cxx: str, out_dir: Path) -> None:
    """Compile every TU in parallel (dropping ISA ones that fail), then kernel.cpp, and link."""
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as tmp:
        tmpd = Path(tmp)
        isa = ISA_SOURCES if _is_x86() else {}
        jobs = {src: flags for src, (flags, _) in isa.items()}
        jobs.update({src: () for src in CORE_SOURCES if src != DISPATCH_SOURCE})
        with ThreadPoolExecutor(max_workers=len(jobs)) as ex:
            futs = {src: ex.submit(_compile, cxx, src, fl, tmpd / f"{src}.o") for src, fl in jobs.items()}
            results = {src: fut.result() for src, fut in futs.items()}
        for src, (ok, err) in results.items():
            if not ok and src not in isa:
                raise BuildError(f"compiling {src} failed:\n{err}")
        built = [src for src in isa if results[src][0]]
        # the dispatcher learns which ISA paths exist from FT_HAVE_<ISA> macros
        ok, err = _compile(cxx, DISPATCH_SOURCE, tuple(f"-D{ISA_SOURCES[s][1]}" for s in built), tmpd / "k.o")
        if not ok:
            raise BuildError(f"compiling {DISPATCH_SOURCE} failed:\n{err}")
        objs = [tmpd / f"{src}.o" for src in results if results[src][0]] + [tmpd / "k.o"]
        lib_tmp = tmpd / LIB_NAME
        cmd = [cxx, "-shared", "-pthread", *map(str, objs), "-o", str(lib_tmp)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BuildError(f"linking failed:\n{proc.stderr[-2000:]}")
        os.replace(lib_tmp, out_dir / LIB_NAME)  # atomic: readers never see a half-written file


def library_path(cache_dir: str | None = None) -> Path:
    """Path of the built library, building it first when needed. Raises BuildError."""
    cxx = _compiler()
    out_dir = Path(cache_dir or env().cache_dir) / "kernels" / f"cpu_experts-{build_key(cxx)}"
    return _built_once(out_dir / LIB_NAME, lambda: _build_into(cxx, out_dir))


def single_source_library(src: Path, lib_name: str, flags: tuple[str, ...] = ()) -> Path:
    """A shared library of one C++ source (other packages' small CPU ops), built on first use and cached like the
    expert kernel's: by a hash of the source, the compiler's version, the machine and the flags. Raises
    BuildError."""
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
