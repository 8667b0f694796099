"""Build and cache the two peer servers, once, under ~/.cache/uma-serve/peers/.

Both come from the llama-cpp-python source package on PyPI (llama.cpp is vendored in it):
- `llama-server`: built from vendor/llama.cpp with CMake, native CPU flags and a Release build,
  which is what llama-cpp-python's own `pip install` builds by default (our core's build).
- the batched server (`examples/server/server.py`): its own virtualenv with the dependencies of
  the script header, and llama-cpp-python installed from the same version (pip reuses its
  cached wheel, built with the default flags).

`python -m uma_serve.bench.peers_build [llama-server|batched|llama-batched-bench|all]` builds
ahead of time; `llama-batched-bench` is `bench ceiling`'s ceiling (llama.cpp's own batched decode).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
BATCHED_DEPS = [
    "fastapi",
    "jinja2",
    "numpy",
    "openai",
    "pydantic",
    "safetensors",
    "uvicorn",
    "websockets",
]


def cache_dir() -> Path:
    base = os.environ.get("UMA_PEERS_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(xdg) / "uma-serve" / "peers"


def sdist_dir() -> Path:
    return cache_dir() / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"


def llama_server_bin() -> Path:
    """The cached build, or UMA_LLAMA_SERVER: a llama-server built elsewhere (e.g. with CUDA)."""
    prebuilt = os.environ.get("UMA_LLAMA_SERVER")
    if prebuilt:
        return Path(prebuilt)
    return cache_dir() / "bin" / "llama-server"


def batched_bench_bin() -> Path:
    """llama.cpp's own batched decode benchmark (the ceiling), or UMA_LLAMA_BATCHED_BENCH."""
    prebuilt = os.environ.get("UMA_LLAMA_BATCHED_BENCH")
    if prebuilt:
        return Path(prebuilt)
    return cache_dir() / "bin" / "llama-batched-bench"


def batched_python() -> Path:
    return cache_dir() / "batched-venv" / "bin" / "python"


def batched_script() -> Path:
    """The batched server script as run: a copy of examples/server/server.py whose one change
    makes `from llama_cpp import mtmd_cpp` optional. Our llama-cpp-python wheel (the cached one,
    built by `make install` with -DLLAVA_BUILD=OFF) has no libmtmd, and the script imports it at
    load time although only multimodal requests use it."""
    return cache_dir() / "batched-server.py"


MTMD_IMPORT = "from llama_cpp import mtmd_cpp  # noqa: E402"


def write_batched_script() -> Path:
    src = (sdist_dir() / "examples" / "server" / "server.py").read_text()
    if MTMD_IMPORT not in src:
        raise RuntimeError("examples/server/server.py changed: mtmd import not found")
    patched = src.replace(
        MTMD_IMPORT,
        "try:  # UMA bench: text-only use; the wheel may lack libmtmd\n"
        "    from llama_cpp import mtmd_cpp  # noqa: E402\n"
        "except (ImportError, OSError):\n"
        "    mtmd_cpp = None\n",
        1,
    )
    out = batched_script()
    out.write_text(patched)
    return out


def _log(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def ensure_sdist() -> Path:
    """Download (pip download, source only) and unpack the llama-cpp-python sdist."""
    dest = sdist_dir()
    if (dest / "vendor" / "llama.cpp" / "CMakeLists.txt").exists():
        return dest
    dl = cache_dir() / "sdist"
    dl.mkdir(parents=True, exist_ok=True)
    archive = dl / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    if not archive.exists():
        _log(f"downloading llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} sdist from PyPI")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                "-d",
                str(dl),
            ],
            check=True,
        )
    with tarfile.open(archive) as tf:
        tf.extractall(cache_dir(), filter="data")
    return dest


def cmake_args(build: Path) -> list[str]:
    return [
        "cmake",
        "-S",
        str(sdist_dir() / "vendor" / "llama.cpp"),
        "-B",
        str(build),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON",  # llama-cpp-python's default build (ours) is native too
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
    ]


def ensure_llama_server(jobs: int = 2) -> Path:
    return _ensure_tool(llama_server_bin(), "llama-server", jobs)


def ensure_batched_bench(jobs: int = 2) -> Path:
    return _ensure_tool(batched_bench_bin(), "llama-batched-bench", jobs)


def _ensure_tool(out: Path, target: str, jobs: int) -> Path:
    """One llama.cpp tool from the vendored sources, built once (one build folder for all)."""
    if out.exists():
        return out
    ensure_sdist()
    build = cache_dir() / "build-llama-server"
    _log(f"building {target} into {build} (several minutes on 2 cores)")
    subprocess.run(cmake_args(build), check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build), "--target", target, f"-j{jobs}"], check=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(build / "bin" / target, out)
    return out


def ensure_batched() -> tuple[Path, Path]:
    py = batched_python()
    marker = py.parent.parent / ".uma-ready"
    if marker.exists():
        if not batched_script().exists():
            write_batched_script()
        return py, batched_script()
    ensure_sdist()
    _log("creating the batched server's virtualenv")
    subprocess.run([sys.executable, "-m", "venv", str(py.parent.parent)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, *BATCHED_DEPS], check=True)
    # same version as our core's; pip reuses the wheel it cached when it built ours
    subprocess.run([*pip, f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], check=True)
    write_batched_script()
    marker.write_text("ok\n")
    return py, batched_script()


def main(argv: list[str] | None = None) -> int:
    which = (argv or sys.argv[1:] or ["all"])[0]
    if which in ("llama-server", "all"):
        print(ensure_llama_server())
    if which in ("batched", "all"):
        print(ensure_batched())
    if which in ("llama-batched-bench", "all"):
        print(ensure_batched_bench())
    return 0


if __name__ == "__main__":
    sys.exit(main())
