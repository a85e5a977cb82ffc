"""A driver that dies between a batch's two commits: the target table's landed, the key state's not."""

from __future__ import annotations

from typing import Any

import pytest

from cdcflow.connectors.lakehouse.delta import key_state

MESSAGE = "the driver died before the state commit"


def crash_before_next_state_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next key-state commit raises ``RuntimeError(MESSAGE)``; the ones after it run as usual."""
    save = key_state.save
    crashes: list[bool] = []

    def crash_once(*args: Any, **kwargs: Any) -> None:
        if not crashes:
            crashes.append(True)
            raise RuntimeError(MESSAGE)
        save(*args, **kwargs)

    monkeypatch.setattr(key_state, "save", crash_once)
