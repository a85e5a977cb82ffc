"""Each folder imports only what docs/architecture.md allows it ("Folders and allowed imports").

core <- formats <- connectors/{kafka,replay} <- connectors/spark <- connectors/lakehouse (glue) <- api.
Every import statement counts, wherever it is: module level, inside a function, under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("core", "formats", "connectors", "api")
SHIMS = ROOT / "connectors" / "shims"  # top-level pyspark_cdc_* modules, not in the cdcflow namespace
LAYERS = ("cdcflow.core", "cdcflow.formats", "cdcflow.connectors")
"""Everything else in the cdcflow namespace is api/: cdcflow itself, cdcflow.cli, cdcflow.spark, ..."""
ARROW_ONLY = ("pyarrow", "numpy")
"""Formats code imports these only in formats/debezium/arrow*: the rest must load without them."""
NO_SPARK = ("pyspark", "delta", "py4j", "cdcflow.connectors.spark", "cdcflow.connectors.lakehouse")
"""What connectors/kafka, connectors/replay and connectors/errors must not import."""
DELTA_MAY_IMPORT = (
    "cdcflow.core",
    "cdcflow.formats",
    "cdcflow.connectors.errors",
    "cdcflow.connectors.lakehouse.delta",
)
"""The cdcflow modules connectors/lakehouse/delta may import (today it needs only formats.redact)."""
PACKAGES = (
    "cdcflow.core",
    "cdcflow.formats.debezium",
    "cdcflow.connectors.kafka",
    "cdcflow.connectors.replay",
    "cdcflow.connectors.spark",
    "cdcflow.connectors.lakehouse.delta",
    "cdcflow.cli",
)
"""The packages the rules name: each must exist, or the rules about it pass without checking anything."""


def module_name(path: Path) -> str:
    """core/x.py -> cdcflow.core.x, formats/debezium/json.py -> cdcflow.formats.debezium.json,
    api/cli/ingest.py -> cdcflow.cli.ingest, api/__init__.py -> cdcflow."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "api":
        parts = parts[1:]
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(["cdcflow", *parts])


def modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if SHIMS not in path.parents
    }


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, name) of every import; ``from m import a`` gives ``m.a`` (``a`` may be a submodule),
    a relative import its leading dots."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            yield node.lineno, "." * node.level + (node.module or "")
        elif isinstance(node, ast.ImportFrom):
            yield from ((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)


def under(name: str, *prefixes: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def is_arrow(name: str) -> bool:
    """formats/debezium/arrow.py and arrow_columns.py."""
    return name.startswith("cdcflow.formats.debezium.arrow")


def violation(module: str, name: str) -> str | None:
    """Why ``module`` may not import ``name``; None when it may."""
    if name.startswith("."):
        return "relative import: import absolutely"
    if not under(module, *LAYERS):
        return None  # api/ may import anything
    top = name.partition(".")[0]
    if top == "cdcflow" and not under(name, *LAYERS):
        return "imports the public API (cdcflow, cdcflow.cli, cdcflow.spark, ...): only api/ may"
    if under(module, "cdcflow.core"):
        if top != "cdcflow" and top not in sys.stdlib_module_names:
            return "core imports only the standard library"
        if top == "cdcflow" and not under(name, "cdcflow.core"):
            return "core imports no other cdcflow package"
    if under(module, "cdcflow.formats"):
        if top == "cdcflow" and not under(name, "cdcflow.core", "cdcflow.formats"):
            return "formats imports only cdcflow.core and cdcflow.formats"
        if top in ARROW_ONLY and not is_arrow(module):
            return f"{top} is imported in formats only by formats/debezium/arrow*"
        if is_arrow(name) and not is_arrow(module):
            return "only formats/debezium/arrow* imports formats/debezium/arrow* (it needs pyarrow)"
    kafka_side = ("cdcflow.connectors.kafka", "cdcflow.connectors.replay", "cdcflow.connectors.errors")
    if (module == "cdcflow.connectors" or under(module, *kafka_side)) and under(name, *NO_SPARK):
        return "connectors/kafka, replay and errors import no Spark, nothing of connectors/spark or lakehouse"
    if under(module, "cdcflow.connectors.spark") and under(name, "cdcflow.connectors.lakehouse"):
        return "connectors/spark imports nothing of connectors/lakehouse"
    if under(module, "cdcflow.connectors.lakehouse.delta"):
        if under(name, "pyspark", "delta", "py4j"):
            return "connectors/lakehouse/delta imports no Spark"
        if top == "cdcflow" and not under(name, *DELTA_MAY_IMPORT):
            return f"connectors/lakehouse/delta imports only {', '.join(DELTA_MAY_IMPORT)}"
    return None


def test_imports_follow_the_layers() -> None:
    found = modules()
    missing = [package for package in PACKAGES if package not in found]
    assert not missing, f"packages the layer rules name are gone: {missing} (update the rules)"
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {module} imports {name}: {reason}"
        for module, path in found.items()
        for line, name in imports(path)
        if (reason := violation(module, name)) is not None
    ]
    assert not problems, "\n".join(["imports against docs/architecture.md:", *problems])


def test_subpackage_inits_import_nothing() -> None:
    """A package's ``__init__`` runs on every import of its modules: only core and formats re-export."""
    problems = [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for module, path in modules().items()
        if path.name == "__init__.py" and under(module, *LAYERS)
        if module not in ("cdcflow.core", "cdcflow.formats")
        for line, name in imports(path)
        if not name.startswith("__future__.")
    ]
    assert not problems, "\n".join(["__init__.py files with imports:", *problems])
