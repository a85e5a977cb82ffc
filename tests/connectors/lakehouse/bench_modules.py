"""Modules of bench/ loaded by path: bench/ itself stays off sys.path (its names are generic)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def bench_module(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).parents[3] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
