"""What a format that reads its writer schemas from a Schema Registry needs before it runs."""

from __future__ import annotations

from typing import Protocol

from cdcflow.formats.errors import FormatOptionError


class RegistrySettings(Protocol):
    @property
    def url(self) -> str | None: ...

    @property
    def writer_schema(self) -> str | None: ...

    @property
    def schema_id(self) -> int | None: ...

    @property
    def subject(self) -> str | None: ...


def require_writer_schemas(name: str, config: RegistrySettings, written_as: str) -> None:
    """A decoder needs the registry or the writer schema itself (``written_as``: its notation)."""
    if config.url is None and config.writer_schema is None:
        raise FormatOptionError(
            f"format '{name}' needs the writer schemas: set '{name}.url' to the Schema Registry, or "
            f"'{name}.schema' to the writer schema ({written_as})"
        )


def require_subject(name: str, config: RegistrySettings, topic: str | None, default: str) -> None:
    """An encoder registering its writer schema needs a subject: the option, or one named after the
    topic (``default`` says whose default that is)."""
    if config.url is not None and config.schema_id is None and config.subject is None and topic is None:
        raise FormatOptionError(
            f"set '{name}.subject' to register the writer schema under ({default} is '<topic>-value', "
            "and no topic was given)"
        )
