"""The package's C libraries: plain C (no Python.h), built with the package as extension
modules (pyproject.toml) and loaded with ctypes."""

from __future__ import annotations

import ctypes
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path


def library(directory: Path, name: str) -> tuple[ctypes.PyDLL, ctypes.CDLL]:
    """``directory/name*.so`` as calls that keep the GIL (short ones: releasing it costs more,
    core/runtime/gil.py) and calls that release it."""
    found = [directory / f"{name}{s}" for s in EXTENSION_SUFFIXES]
    found = [path for path in found if path.exists()]
    if not found:
        raise ImportError(f"{directory / name} is not built: reinstall the package")
    return ctypes.PyDLL(str(found[0])), ctypes.CDLL(str(found[0]))
