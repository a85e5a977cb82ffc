"""The options of the suite's Spark JVMs: a class-data-sharing archive, and the tiers of a short JVM.

The JIT: Spark's code is large and a test's JVM lives minutes, so the optimizing compiler (C2) spends
more CPU than it saves: ~90 of the ~150 CPU-seconds the driver of a ten-batch ingest on the Spark back
end burns. With two workers on two cores that CPU is the suite's time; the client compiler only
(``-XX:TieredStopAtLevel=1``) and the serial collector, as the broker and Connect run, took a pair of
such ingests from 237 to 165 s. The code cache keeps the size tiered compilation gives it (240 MB):
with the client compiler only the JVM reserves 48 MB, which Spark and Delta fill in a few minutes (62 MB
after twelve merges and reads per conf in a benchmark session), after which ``CodeCache is full. Compiler
has been disabled`` and the rest of the JVM's life is interpreted: the Spark back end's golden and
back-end tests, run alone, took 522 s with the 48 MB and 463 s with 240 MB. These options never change
what a test checks.

The archive: the suite starts dozens of Spark drivers (its sessions, every ``python -m cdcflow``, the
crash runs, the cluster's applications); loading and verifying Spark's classes is ~10 of the ~28
CPU-seconds each takes to start and run a small job. The archive is written once per virtualenv, Java,
Spark and Delta jars by running the demo ingest on the Spark back end (Delta Lake's MERGE; the demo on
delta-rs when Delta's jars are not fetched) with ``-XX:ArchiveClassesAtExit``; then ``SPARK_SUBMIT_OPTS``
(read by ``spark-submit``, which every PySpark driver goes through) maps it into each driver.
``scripts/test.sh`` writes it before pytest starts (``python tests/jvm_options.py``), as it installs the
jars; a pytest run on a virtualenv without one writes it first. A JVM whose class path differs (another
``SPARK_HOME`` or ``SPARK_CONF_DIR``) ignores the archive, and its warnings are turned off so no test sees
them on stdout. ``CDCFLOW_TEST_JVM_OPTIONS=0`` runs without either.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "connectors"))

from java_cache import component  # noqa: E402

QUIET = "-Xlog:cds*=off -Xlog:class+path=off"
QUICK = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -XX:+UseSerialGC"
TRAINING_TIMEOUT = 300.0


def use_quick_jvms() -> None:
    """Put the options in ``SPARK_SUBMIT_OPTS`` for this process and its children, writing the archive
    first if this virtualenv has none for this Java and Spark (without one, the demo failed: only the
    tiers)."""
    options = os.environ.get("SPARK_SUBMIT_OPTS", "")
    if os.environ.get("CDCFLOW_TEST_JVM_OPTIONS") == "0" or QUICK in options:
        return
    options = f"{options} {QUICK}".strip()
    archive = _archive_path()
    if archive is not None:
        archive.parent.mkdir(parents=True, exist_ok=True)
        with (archive.parent / "lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another test session on this virtualenv writes it once
            if not archive.is_file():
                _write(archive)
        if archive.is_file():
            options = f"{options} -XX:SharedArchiveFile={archive} {QUIET}"
    os.environ["SPARK_SUBMIT_OPTS"] = options


def jvm_options() -> str:
    """The same options for the JVMs spark-submit does not start (``spark.executor.extraJavaOptions``,
    the standalone daemons' ``SPARK_DAEMON_JAVA_OPTS``), or "" when they are off."""
    given = os.environ.get("SPARK_SUBMIT_OPTS", "")
    if QUICK not in given:
        return ""
    archive = _archive_options(given)
    return " ".join([QUICK, *archive, *([QUIET] if archive else [])])


def _archive_options(options: str) -> list[str]:
    return [option for option in options.split() if option.startswith("-XX:SharedArchiveFile=")]


def _archive_path() -> Path | None:
    try:
        import pyspark
        from pyspark.find_spark_home import _find_spark_home

        java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=60, check=True)  # noqa: S607
    except (ImportError, OSError, subprocess.SubprocessError):
        return None
    jars = sorted(p.name for p in (Path(_find_spark_home()) / "jars").glob("*.jar"))
    delta = _delta_jars()
    jars += sorted(p.name for p in delta.glob("*.jar")) if delta is not None else []
    key = hashlib.sha256("\n".join([java.stderr, pyspark.__version__, *jars]).encode()).hexdigest()[:16]
    return Path(sys.prefix) / "cdcflow-test-cache" / f"spark-driver-{key}.jsa"


def _delta_jars() -> Path | None:
    return component("delta", fetch=False)


def _write(archive: Path) -> None:
    """Run the demo ingest (a streaming query, the Python data source, Arrow, foreachBatch, Delta Lake's
    reads and MERGE) and keep the classes its driver loaded."""
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    env["SPARK_SUBMIT_OPTS"] = (
        f"{env.get('SPARK_SUBMIT_OPTS', '')} {QUICK} -XX:ArchiveClassesAtExit={partial} {QUIET}"
    )
    delta = _delta_jars()
    backend = ["--backend", "spark", "--delta-jars", str(delta)] if delta is not None else []
    with tempfile.TemporaryDirectory(prefix="cdcflow-jvm-archive-") as folder:
        try:
            done = subprocess.run(  # noqa: S603
                [sys.executable, "-m", "cdcflow", "ingest", *backend],
                cwd=folder,
                env=env,
                capture_output=True,
                timeout=TRAINING_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return
    if done.returncode == 0 and partial.is_file():
        partial.replace(archive)
    else:
        partial.unlink(missing_ok=True)


if __name__ == "__main__":
    use_quick_jvms()
    mapped = _archive_options(os.environ.get("SPARK_SUBMIT_OPTS", ""))
    print(
        f"   {mapped[0].split('=', 1)[1]}"
        if mapped
        else "   none: Java or PySpark missing, or the demo failed"
    )
