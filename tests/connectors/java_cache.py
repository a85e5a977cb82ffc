"""Where scripts/java_deps.sh keeps the JVM side of the test stack, and the jars of one component."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    return Path(os.environ.get("CDCFLOW_JAVA_CACHE") or Path.home() / ".cache" / "cdcflow-java")


def component(name: str, *, fetch: bool = True) -> Path | None:
    """The folder of ``name``'s jars, fetched with Maven on first use when ``fetch``; None if absent."""
    folder = cache_dir() / name
    if not (folder / ".cdcflow-stamp").exists() and fetch:
        subprocess.run(["bash", str(ROOT / "scripts" / "java_deps.sh"), name], check=True)  # noqa: S603, S607
    return folder if (folder / ".cdcflow-stamp").exists() else None


def jars(*names: str) -> list[str]:
    """The jar files of the named components (fetched when missing)."""
    found: list[str] = []
    for name in names:
        folder = component(name)
        if folder is not None:
            found.extend(sorted(str(jar) for jar in folder.glob("*.jar")))
    return found
