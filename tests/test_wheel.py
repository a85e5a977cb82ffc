"""The wheel holds every module of the source folders, in the ``cdcflow`` namespace, and nothing else: the
tests run on an editable install, which would not notice a package missing from pyproject's list."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "api": "cdcflow",
    "core": "cdcflow/core",
    "formats": "cdcflow/formats",
    "connectors": "cdcflow/connectors",
}


def expected_modules() -> set[str]:
    names = set()
    for folder, target in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT / folder)
            if relative.parts[0] == "shims":
                names.add(relative.name)  # installed at the top level, where Spark looks for pyspark_*
            else:
                names.add(f"{target}/{relative.as_posix()}")
    return names


def test_the_wheel_holds_every_module(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: setuptools' build/ folder would keep modules since deleted
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(  # noqa: S603 - pip on our own project
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("cdcflow-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.endswith(".py")}
    assert shipped == expected_modules()
    assert not any("kafka_mock" in name for name in shipped)
