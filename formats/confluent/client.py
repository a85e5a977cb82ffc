"""Confluent Schema Registry access shared by the registry formats (``debezium-avro-confluent``,
``debezium-json-registry``): the connection options, one client per process and configuration, the
wire-format header, and a writer schema fetched by id with errors that say what to fix.

Clients are never pickled: each executor builds its own on first use. Sharing them per process also
gives a ``mock://`` URL one registry per process, as Confluent's Java mock does.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cdcflow.formats.errors import FieldError, FormatError, FormatOptionError, MissingDependencyError
from cdcflow.formats.options import Option, optional_string
from cdcflow.formats.redact import redact

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

MAGIC_BYTE = 0
HEADER_SIZE = 5

RegistryConfig = tuple[tuple[str, str], ...]
"""The client settings (confluent-kafka's keys), sorted: hashable, picklable, a cache key."""

URL = Option("url", optional_string, None, "the Schema Registry URL(s), comma-separated (mock:// for tests)")
#: Credentials and TLS, after the format's own options in its table.
CONNECTION_OPTIONS: tuple[Option[Any], ...] = (
    Option("basic-auth.user-info", optional_string, None, "<user>:<password> for the Schema Registry"),
    Option("bearer-auth.token", optional_string, None, "a static bearer token for the Schema Registry"),
    Option(
        "bearer-auth.logical-cluster",
        optional_string,
        None,
        "the registry's logical cluster id, which a bearer token needs (Confluent Cloud: lsrc-...)",
    ),
    Option("bearer-auth.identity-pool-id", optional_string, None, "the identity pool of a bearer token"),
    Option("ssl.ca.location", optional_string, None, "a CA certificate file (PEM) for the registry's TLS"),
    Option("ssl.certificate.location", optional_string, None, "a client certificate file (PEM)"),
    Option("ssl.key.location", optional_string, None, "the client certificate's private key file"),
)
#: Our option keys → confluent-kafka's client settings.
CLIENT_KEYS = {
    "url": "url",
    "basic-auth.user-info": "basic.auth.user.info",
    "bearer-auth.token": "bearer.auth.token",
    "bearer-auth.logical-cluster": "bearer.auth.logical.cluster",
    "bearer-auth.identity-pool-id": "bearer.auth.identity.pool.id",
    "ssl.ca.location": "ssl.ca.location",
    "ssl.certificate.location": "ssl.certificate.location",
    "ssl.key.location": "ssl.key.location",
}


def registry_config(values: Mapping[str, Any], prefix: str) -> RegistryConfig:
    """The client settings of parsed options (``OptionSet.parse``), checked: a client can be built."""
    registry = {CLIENT_KEYS[k]: v for k, v in values.items() if k in CLIENT_KEYS and v is not None}
    if "bearer.auth.token" in registry:
        registry["bearer.auth.credentials.source"] = "STATIC_TOKEN"
    if registry and "url" not in registry:
        raise FormatOptionError(
            f"the Schema Registry options ({', '.join(sorted(registry))}) need '{prefix}.url'"
        )
    config = tuple(sorted(registry.items()))
    if config:
        check_client(config)
    return config


_CLIENTS: dict[RegistryConfig, SchemaRegistryClient] = {}
_CLIENTS_LOCK = threading.Lock()


def registry_client(registry: RegistryConfig) -> SchemaRegistryClient:
    """The process's Schema Registry client for this configuration (``mock://`` URLs: a mock)."""
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(registry)
        if client is None:
            try:
                from confluent_kafka.schema_registry import SchemaRegistryClient
            except ImportError:
                raise MissingDependencyError("confluent-kafka", "kafka") from None
            client = SchemaRegistryClient.new_client(dict(registry))
            _CLIENTS[registry] = client
        return client


def check_client(registry: RegistryConfig) -> None:
    try:
        registry_client(registry)
    except (ValueError, TypeError) as error:
        raise FormatOptionError(
            f"the Schema Registry options are not valid: {redact(str(error), registry)}"
        ) from None


def shown_url(registry: RegistryConfig) -> str:
    """The registry URL for messages: credentials in it replaced by ``***``."""
    return redact(dict(registry).get("url", ""), registry)


def schema_id_of(value: bytes, converter: str, other_format: str) -> int:
    """The writer schema id of a value in Confluent's wire format (magic byte 0, 4-byte id)."""
    if value[0] != MAGIC_BYTE:
        raise FieldError(
            "",
            f"not Confluent wire format: first byte is 0x{value[0]:02x}, expected 0x00 (the magic byte of "
            f"Confluent's {converter}); is the topic written with another converter ({other_format})?",
        )
    if len(value) < HEADER_SIZE:
        raise FieldError("", f"the message has {len(value)} bytes, fewer than the 5-byte Confluent header")
    return int.from_bytes(value[1:HEADER_SIZE], "big")


def header_bytes(schema_id: int) -> bytes:
    return bytes([MAGIC_BYTE]) + schema_id.to_bytes(4, "big")


def fetch_schema(
    registry: RegistryConfig, schema_id: int, schema_type: str, prefix: str, subject: str | None = None
) -> str:
    """The text of writer schema ``schema_id``, which must be of ``schema_type`` (AVRO, JSON).

    ``subject`` is the one a confluent-kafka deserializer will ask with: the client caches the schema
    under (id, subject), so the deserializer's own lookup is then no second request.

    An id the registry does not have, or a schema of another type, is the record's fault
    (:class:`FieldError`); a registry that refuses or cannot be reached is not (:class:`FormatError`).
    """
    client = registry_client(registry)
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    url = shown_url(registry)
    try:
        registered = client.get_schema(schema_id, subject)
    except SchemaRegistryError as error:
        if error.http_status_code == 404:
            raise FieldError("", f"schema id {schema_id} is not in the Schema Registry at {url}") from None
        raise FormatError(
            f"{prefix}: the Schema Registry at {url} refused schema id {schema_id}: "
            f"{redact(str(error), registry)}. "
            f"Check '{prefix}.url' and the credentials (basic-auth.user-info, bearer-auth.token)"
        ) from None
    except Exception as error:  # httpx's transport errors, by any name
        raise FormatError(
            f"{prefix}: cannot reach the Schema Registry at {url} to fetch schema id {schema_id} "
            f"({type(error).__name__}: {redact(str(error), registry)}). Check '{prefix}.url' and the "
            f"network, or set '{prefix}.schema' to decode without the registry"
        ) from None
    found = registered.schema_type or "AVRO"
    if found != schema_type:
        raise FieldError("", f"schema id {schema_id} is a {found} schema, not {schema_type}")
    return str(registered.schema_str)


def schema_id(text: str) -> int | None:
    """The ``schema-id`` options: blank, or an id from 0 to 2**31 - 1."""
    if not text.strip():
        return None
    number = int(text.strip()) if text.strip().isdigit() else -1
    if not 0 <= number < 2**31:
        raise ValueError(f"'{text}' is not a schema id (an integer from 0 to 2147483647)")
    return number
