"""A Spark standalone cluster from pyspark's own launcher (``bin/spark-class``): one master and two
workers of one core each, every JVM in a process group of its own; and ``spark-submit`` against it.

Each executor runs in ``<worker dir>/<app id>/<executor id>`` and logs its tasks there (``Running task
... (TID n)``): that is how a test sees which executors ran an application's tasks.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import pyspark
from jvm_options import jvm_options

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
SPARK_SUBMIT = SPARK_HOME / "bin" / "spark-submit"
VENV_PYTHON = sys.executable
START_TIMEOUT_S = 120
_TASK = re.compile(rb"Running task \S+ in stage (\d+)\.\d+ \(TID \d+\)")


def die_with_parent() -> None:
    """The JVM gets SIGTERM when the test process dies without stopping it (a killed pytest)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of every Spark JVM and driver here: loopback only, the venv's Python."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYSPARK_GATEWAY", "SPARK_")) or k == "SPARK_SUBMIT_OPTS"  # tests/jvm_options.py
    }
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_HOME=str(SPARK_HOME),
        PYSPARK_PYTHON=VENV_PYTHON,
        PYSPARK_DRIVER_PYTHON=VENV_PYTHON,
        PATH=f"{Path(VENV_PYTHON).parent}{os.pathsep}{env.get('PATH', '')}",
        SPARK_DAEMON_JAVA_OPTS=jvm_options(),
    )
    env.update(extra)
    return env


class StandaloneCluster:
    def __init__(self, workdir: Path, workers: int = 2) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.ui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.worker_dirs = [workdir / f"worker{n}" for n in range(1, workers + 1)]
        self._processes: list[subprocess.Popen[bytes]] = []
        self._deadline = 0.0
        self._ready = False
        self._failure: str | None = None

    def _launch(self, name: str, *args: str) -> None:
        with (self.workdir / f"{name}.log").open("wb") as log:
            self._processes.append(
                subprocess.Popen(  # noqa: S603 - pyspark's own launcher, fixed arguments
                    [str(SPARK_CLASS), *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=spark_env(),
                    start_new_session=True,
                    preexec_fn=die_with_parent,  # noqa: PLW1509 - no threads are started in between
                )
            )

    def launch(self) -> StandaloneCluster:
        """Starts the master and the workers without waiting for them (:meth:`wait_ready` does): the
        JVMs start while a test's other fixtures (a broker, the local session) start."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._launch(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port)),
        )
        for number, folder in enumerate(self.worker_dirs, 1):
            folder.mkdir(exist_ok=True)
            self._launch(
                f"worker{number}",
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
                *("--webui-port", "0", "--work-dir", str(folder)),
            )
        self._deadline = time.monotonic() + START_TIMEOUT_S
        return self

    def wait_ready(self) -> StandaloneCluster:
        """Returns once every worker is registered with the master (at once after the first time)."""
        if self._failure is not None:
            raise RuntimeError(self._failure)
        while not self._ready and self.alive_workers() < len(self.worker_dirs):
            if time.monotonic() > self._deadline or any(p.poll() is not None for p in self._processes):
                logs = {p.name: p.read_text(errors="replace")[-2000:] for p in self.workdir.glob("*.log")}
                self.stop()
                self._failure = f"the standalone cluster did not start: {logs}"
                raise RuntimeError(self._failure)
            time.sleep(0.5)
        self._ready = True
        return self

    def state(self) -> dict[str, object]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as answer:  # noqa: S310
            state: dict[str, object] = json.load(answer)
            return state

    def alive_workers(self) -> int:
        try:
            workers = self.state()["workers"]
        except (OSError, ValueError):
            # not listening yet, or its UI is up before its JSON page (the master page's HTML answers)
            return 0
        assert isinstance(workers, list)
        return sum(1 for worker in workers if worker["state"] == "ALIVE")

    def applications(self) -> set[str]:
        return {app.name for folder in self.worker_dirs for app in folder.glob("app-*")}

    def tasks_by_executor(self, app: str, stages: Collection[int] | None = None) -> dict[str, int]:
        """Tasks each executor of application ``app`` ran (of its ``stages``, when given), by
        ``worker<n>/<executor id>``."""
        return {
            f"{folder.name}/{executor.name}": sum(
                1
                for stage in _TASK.findall((executor / "stderr").read_bytes())
                if stages is None or int(stage) in stages
            )
            for folder in self.worker_dirs
            for executor in sorted((folder / app).glob("*"))
            if (executor / "stderr").exists()
        }

    def stop(self) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._processes.clear()


def spark_submit(
    args: Sequence[str], log: Path, env: Mapping[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[bytes]:
    """``spark-submit ARGS`` in a session of its own (killed with its JVM on a timeout), output in ``log``."""
    with log.open("wb") as out:
        job = subprocess.Popen(  # noqa: S603 - pyspark's own launcher
            [str(SPARK_SUBMIT), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else spark_env(),
            start_new_session=True,
        )
        try:
            job.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return subprocess.CompletedProcess(job.args, job.returncode)


def cluster_conf(cluster: StandaloneCluster) -> list[str]:
    """Submit options every job on the test cluster takes: small executors, both registered before the
    first task (so each gets tasks), few shuffle partitions, no application UI."""
    settings = {
        "spark.executor.memory": "512m",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
        "spark.executorEnv.CDCFLOW_STRICT_DECODE": os.environ.get("CDCFLOW_STRICT_DECODE", "1"),
    }
    if options := jvm_options():
        settings["spark.executor.extraJavaOptions"] = options
    return ["--master", cluster.master_url, *(f"--conf={k}={v}" for k, v in settings.items())]
