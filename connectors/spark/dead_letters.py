"""Where rejected records go: a directory of JSON-lines files, or a Kafka topic, with their bytes.

A file record holds the original key and value (base64), the coordinates, the format and the reason;
a topic record is the original key, value and headers plus ``cdcflow.error.*`` headers.
"""

from __future__ import annotations

import base64
import os
import tempfile
import uuid
from collections.abc import Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any

import orjson

from cdcflow.connectors.spark.accounting import attempt_suffix, discard, publish
from cdcflow.formats.base import DeadLetter
from cdcflow.formats.redact import redact

if TYPE_CHECKING:
    from cdcflow.connectors.spark.read_plan import DeadLetterTarget

DEAD_LETTER_PREFIX = "dead-letters-"


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def dead_letter_record(letter: DeadLetter) -> dict[str, Any]:
    message = letter.message
    return {
        "format": letter.format_name,
        "reason": redact(letter.reason),  # files and the cdcflow.error.reason header
        "field": letter.field,
        "origin": message.origin(),
        "topic": message.topic,
        "partition": message.partition,
        "offset": message.offset,
        "timestamp": message.timestamp_ms,
        "file": message.file,
        "line": message.line,
        "key": _b64(message.key),
        "value": _b64(message.value),
        "headers": [[name, _b64(value)] for name, value in message.headers],
    }


class DeadLetterWriter:
    """Writes one task's rejected records, exactly once per input range.

    Records go to a temporary file (in the dead-letter directory, else a local temporary file) while
    the task runs; :meth:`commit` (the task read its whole range) renames it to
    ``dead-letters-<range>.jsonl`` and sends it to the topic, :meth:`abort` (the task failed) drops it.
    A retried task or a restarted micro-batch reads the same range, so it replaces the file rather
    than adding one. Without a range name (outside Spark) each writer gets a file of its own.
    """

    def __init__(self, target: DeadLetterTarget, range_name: str | None = None) -> None:
        self.target = target
        self.range_name = range_name or uuid.uuid4().hex
        self._file: IO[bytes] | None = None
        self._temporary: str | None = None
        self.written = 0

    def write(self, letters: Sequence[DeadLetter]) -> None:
        if not letters:
            return
        spool = self._spool()
        for letter in letters:
            spool.write(orjson.dumps(dead_letter_record(letter)) + b"\n")
        self.written += len(letters)

    def _spool(self) -> IO[bytes]:
        if self._file is None:
            if self.target.path is not None:
                os.makedirs(self.target.path, exist_ok=True)
                self._temporary = os.path.join(
                    self.target.path, f".{DEAD_LETTER_PREFIX}{self.range_name}.{attempt_suffix()}.tmp"
                )
                self._file = open(self._temporary, "w+b")  # noqa: SIM115 - closed in commit() / abort()
            else:
                self._file = tempfile.TemporaryFile()  # noqa: SIM115 - the topic's records until commit()
        return self._file

    def commit(self) -> None:
        """The task read its whole range: its dead letters replace any earlier attempt's."""
        if self._file is None:
            return
        spool, self._file = self._file, None
        try:
            spool.flush()
            if self.target.topic is not None:
                spool.seek(0)
                self._produce(orjson.loads(line) for line in spool)
        finally:
            spool.close()
        if self._temporary is not None:
            assert self.target.path is not None  # noqa: S101 - a temporary file is in the directory
            publish(
                self._temporary,
                os.path.join(self.target.path, f"{DEAD_LETTER_PREFIX}{self.range_name}.jsonl"),
            )
            self._temporary = None

    def abort(self) -> None:
        """The task failed: nothing of this attempt is kept (the retry writes the range again)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._temporary is not None:
            discard(self._temporary)
            self._temporary = None

    def _produce(self, records: Iterable[dict[str, Any]]) -> None:
        from cdcflow.connectors.kafka.producer import KafkaProducerSink

        assert self.target.kafka is not None and self.target.topic is not None  # noqa: S101
        producer = KafkaProducerSink(self.target.kafka, self.target.topic)
        for record in records:
            headers = [
                *((name, _unb64(value)) for name, value in record["headers"]),
                ("cdcflow.error.reason", record["reason"].encode()),
                ("cdcflow.error.field", (record["field"] or "").encode()),
                ("cdcflow.error.format", record["format"].encode()),
                ("cdcflow.error.origin", record["origin"].encode()),
            ]
            producer.produce(_unb64(record["key"]), _unb64(record["value"]), headers=headers)
        producer.flush()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def read_dead_letters(path: str) -> list[dict[str, Any]]:
    """Every dead-letter record under ``path`` (for tests and tooling), in file-name order."""
    records: list[dict[str, Any]] = []
    if not os.path.isdir(path):
        return records
    for name in sorted(os.listdir(path)):
        if name.startswith(DEAD_LETTER_PREFIX) and name.endswith(".jsonl"):
            with open(os.path.join(path, name), "rb") as handle:
                records.extend(orjson.loads(line) for line in handle if line.strip())
    return records
