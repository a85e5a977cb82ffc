"""Schema blocks read once: a ``debezium-json`` decoder with ``schema-include`` parses a message's Connect
schema block only when its opening bytes are new, and then reads the payload alone.

On the project's PostgreSQL recording (three tables, two with a 2-5 kB block in every message, as
Kafka Connect's JsonConverter writes them): the changes equal those of the same messages re-spaced
(so no message opens with a known block and each is parsed whole), and only the first message of
each block is parsed whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import cdcflow.formats.debezium.json as debezium_json
from cdcflow.formats import Message, resolve_format
from cdcflow.formats.errors import DecodeError

RECORDING = Path(__file__).parent / "recorded" / "postgres" / "schemas.jsonl"
OPTIONS = {"schema-include": "true", "changelog-mode": "upsert"}


def messages(respace: bool = False) -> list[Message]:
    found = []
    for offset, line in enumerate(RECORDING.read_text().splitlines()):
        record = json.loads(line)
        value = record["value"]
        if value is not None and respace:
            value = '{"schema": ' + json.dumps(json.loads(value), indent=1)[len('{\n "schema": ') :]
        key = record["key"].encode() if record["key"] else None
        found.append(Message(value and value.encode(), key=key, topic=record["topic"], offset=offset))
    return found


def decoded(records: list[Message]) -> list[tuple[str, str, dict[str, Any]]]:
    by_topic: dict[str, Any] = {}
    out = []
    for message in records:
        decoder = by_topic.setdefault(message.topic, resolve_format("debezium-json").create_decoder(OPTIONS))
        for change in decoder.decode_all([message]).changes:
            out.append((message.topic, change.kind.value, change.row))
    return out


def test_known_blocks_are_not_parsed_again_and_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    whole: list[bytes] = []
    parse = debezium_json.parse_json

    def counting(data: bytes) -> Any:
        if data.startswith(b'{"schema":'):
            whole.append(data)
        return parse(data)

    monkeypatch.setattr(debezium_json, "parse_json", counting)
    fast = decoded(messages())
    parsed_whole = len(whole)
    whole.clear()
    slow = decoded(messages(respace=True))
    assert repr(fast) == repr(slow) and len(fast) > 20  # repr: NaN values compare unequal
    blocks = {
        json.dumps(json.loads(m.value)["schema"], sort_keys=True) for m in messages() if m.value is not None
    }
    assert parsed_whole == len(blocks) < len(whole), (parsed_whole, len(blocks), len(whole))


def test_a_message_after_its_block_that_is_not_json_fails_as_before() -> None:
    good = next(m for m in messages() if m.value is not None and m.topic.endswith("cdc_small"))
    assert good.value is not None
    decoder = resolve_format("debezium-json").create_decoder(OPTIONS)
    decoder.decode_all([good])
    broken = Message(good.value[:-1] + b",}", topic=good.topic, offset=99)
    with pytest.raises(DecodeError, match="offset 99.*not valid JSON"):
        decoder.decode_all([broken])
