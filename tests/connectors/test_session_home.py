"""Local sessions whose Python workers import the installed pyspark, not ``$SPARK_HOME``'s zip."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pyspark
import pytest

from cdcflow.connectors.spark.session import installed_pyspark_workers, worker_spark_home

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PACKAGE = Path(pyspark.__file__).parent


def test_the_home_is_the_installed_spark_without_the_python_zips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    home = worker_spark_home(tmp_path)
    assert home is not None
    root = Path(home)
    assert (root / "bin" / "spark-submit").resolve() == (PACKAGE / "bin" / "spark-submit").resolve()
    assert (root / "jars").resolve() == (PACKAGE / "jars").resolve()
    assert any((root / "jars").glob("spark-core_*.jar"))
    assert (PACKAGE / "python" / "lib" / "pyspark.zip").is_file()
    assert list((root / "python" / "lib").iterdir()) == []
    assert worker_spark_home(tmp_path) == home  # built once, then found
    assert [p.name for p in (tmp_path / "spark-home").iterdir()] == [root.name]  # no half-built folder left


def test_another_worker_python_keeps_sparks_own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")
    assert worker_spark_home(tmp_path) is None
    monkeypatch.delenv("PYSPARK_PYTHON")
    assert worker_spark_home(tmp_path) is None  # Spark would start python3 from PATH
    assert not (tmp_path / "spark-home").exists()


def test_spark_home_is_set_only_while_the_session_starts_and_never_over_the_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    with installed_pyspark_workers():
        assert os.environ["SPARK_HOME"] == worker_spark_home(tmp_path / "cdcflow")
    assert "SPARK_HOME" not in os.environ
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    with installed_pyspark_workers():
        assert os.environ["SPARK_HOME"] == "/opt/spark"
    assert os.environ["SPARK_HOME"] == "/opt/spark"


def test_the_test_sessions_workers_import_the_installed_pyspark(spark: SparkSession) -> None:
    """The session of the suite starts the way cdcflow's local sessions do: its Python workers run the
    installed pyspark (compiled once), not a copy compiled from the zip in every process."""

    def origin(_: object) -> list[str]:
        import pyspark as worker_pyspark

        return [str(worker_pyspark.__file__), os.environ.get("SPARK_HOME", "")]

    found = spark.sparkContext.parallelize([0], 1).mapPartitions(origin).collect()
    assert Path(found[0]).resolve() == Path(pyspark.__file__).resolve()
    assert ".zip" not in found[0]
    assert found[1] == worker_spark_home()  # the JVM's SPARK_HOME, passed on to its workers
