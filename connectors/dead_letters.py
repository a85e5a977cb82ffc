"""Where rejected records go: a directory of JSON-lines files, or a Kafka topic, with their bytes.

A file record holds the original key and value (base64), the coordinates, the format and the reason;
a topic record is the original key, value and headers plus ``cdcflow.error.*`` headers.
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

import orjson

from cdcflow.formats.base import DeadLetter

if TYPE_CHECKING:
    from cdcflow.connectors.kafka_client import KafkaProducerSink
    from cdcflow.connectors.read_plan import DeadLetterTarget


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def dead_letter_record(letter: DeadLetter) -> dict[str, Any]:
    message = letter.message
    return {
        "format": letter.format_name,
        "reason": letter.reason,
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
    """Writes one task's rejected records; files are named uniquely, so tasks never share one."""

    def __init__(self, target: DeadLetterTarget) -> None:
        self.target = target
        self._file: IO[bytes] | None = None
        self._producer: KafkaProducerSink | None = None

    def write(self, letters: Sequence[DeadLetter]) -> None:
        if self.target.path is not None:
            if self._file is None:
                os.makedirs(self.target.path, exist_ok=True)
                name = os.path.join(self.target.path, f"dead-letters-{uuid.uuid4().hex}.jsonl")
                self._file = open(name, "ab")  # noqa: SIM115 - closed in close()
            for letter in letters:
                self._file.write(orjson.dumps(dead_letter_record(letter)) + b"\n")
            self._file.flush()
        if self.target.topic is not None:
            producer = self._kafka()
            for letter in letters:
                message = letter.message
                headers = [
                    *message.headers,
                    ("cdcflow.error.reason", letter.reason.encode()),
                    ("cdcflow.error.field", (letter.field or "").encode()),
                    ("cdcflow.error.format", letter.format_name.encode()),
                    ("cdcflow.error.origin", message.origin().encode()),
                ]
                producer.produce(message.key, message.value, headers=headers)
            producer.flush()

    def _kafka(self) -> KafkaProducerSink:
        if self._producer is None:
            from cdcflow.connectors.kafka_client import KafkaProducerSink

            assert self.target.kafka is not None and self.target.topic is not None  # noqa: S101
            self._producer = KafkaProducerSink(self.target.kafka, self.target.topic)
        return self._producer

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._producer is not None:
            self._producer.flush()


def read_dead_letters(path: str) -> list[dict[str, Any]]:
    """Every dead-letter record under ``path`` (for tests and tooling), in file-name order."""
    records: list[dict[str, Any]] = []
    if not os.path.isdir(path):
        return records
    for name in sorted(os.listdir(path)):
        if name.startswith("dead-letters-") and name.endswith(".jsonl"):
            with open(os.path.join(path, name), "rb") as handle:
                records.extend(orjson.loads(line) for line in handle if line.strip())
    return records
