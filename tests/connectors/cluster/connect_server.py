"""A Spark Connect server (``SparkConnectServer`` through ``spark-submit``, as Spark's
``sbin/start-connect-server.sh`` starts it) on ``local[2]``, its Python workers the venv's Python."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from standalone import SPARK_SUBMIT, START_TIMEOUT_S, die_with_parent, free_port, spark_env

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_STARTED = b"Spark Connect server started"


class ConnectServer:
    def __init__(self, workdir: Path, master: str = "local[2]") -> None:
        self.workdir = workdir
        self.master = master
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self.log = workdir / "connect-server.log"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> ConnectServer:
        settings = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.streaming.stateStore.providerClass": (
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
            ),
            "spark.sql.timeType.enabled": "true",
        }
        with self.log.open("wb") as out:
            self._process = subprocess.Popen(  # noqa: S603 - pyspark's own launcher
                [
                    str(SPARK_SUBMIT),
                    *("--class", SERVER_CLASS, "--name", "cdcflow-connect", "--master", self.master),
                    *(f"--conf={key}={value}" for key, value in settings.items()),
                    "spark-internal",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=spark_env(),
                cwd=self.workdir,
                start_new_session=True,
                preexec_fn=die_with_parent,  # noqa: PLW1509 - no threads are started in between
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while _STARTED not in self.log.read_bytes():
            if time.monotonic() > deadline or self._process.poll() is not None:
                text = self.log.read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"the Spark Connect server did not start: {text}")
            time.sleep(0.5)
        return self

    def stop(self) -> None:
        if self._process is None:
            return
        if self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGTERM)
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
        self._process = None
