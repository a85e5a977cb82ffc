"""Secrets never shown: the redaction rule, and the Schema Registry's options through real error paths
(a bad URL, an unreachable registry, a missing schema that becomes a dead letter, a registry whose
refusal quotes the credentials) and the parsed configuration's repr."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
from avro_events import FACTORY, messages
from registry_server import JsonHandler, serving

from cdcflow.formats import FormatError, FormatOptionError
from cdcflow.formats.debezium import avro as debezium_avro
from cdcflow.formats.redact import PLACEHOLDER, is_secret, redact, redacted_repr, shown_settings

SECRET = "hunter2-s3cr3t"  # noqa: S105 - a made-up password


SECRET_KEYS = [
    "sasl.password",
    "kafka.sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "ssl.truststore.password",
    "ssl.key.pem",
    "ssl.key.location",
    "sasl.jaas.config",
    "sasl.oauthbearer.config",
    "kafka.sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "basic.auth.user.info",
    "debezium-avro-confluent.basic-auth.user-info",
    "bearer.auth.token",
    "bearer-auth.token",
    "sasl.kerberos.keytab",
]
NOT_SECRET = ["bootstrap.servers", "sasl.username", "sasl.mechanisms", "sasl.oauthbearer.method", "url"]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_settings_are_shown_as_the_placeholder(key: str) -> None:
    assert is_secret(key)
    assert shown_settings({key: SECRET, "client.id": "me"}) == {key: PLACEHOLDER, "client.id": "me"}
    assert redact(f"librdkafka said: bad value {SECRET}!", [(key, SECRET)]) == (
        f"librdkafka said: bad value {PLACEHOLDER}!"
    )


@pytest.mark.parametrize("key", NOT_SECRET)
def test_ordinary_settings_are_shown(key: str) -> None:
    assert not is_secret(key)
    assert shown_settings({key: "host:9092"}) == {key: "host:9092"}


TEXTS = [
    (f"at https://alice:{SECRET}@registry:8081/x", f"at https://{PLACEHOLDER}@registry:8081/x"),
    (f"at http://alice:p@{SECRET}@registry/", f"at http://{PLACEHOLDER}@registry/"),
    (
        f"GET http://registry/subjects?api_key={SECRET}&x=1",
        f"GET http://registry/subjects?api_key={PLACEHOLDER}&x=1",
    ),
    (f"header Authorization: Bearer {SECRET}", f"header Authorization: Bearer {PLACEHOLDER}"),
    (f'jaas password="{SECRET}";', f'jaas password="{PLACEHOLDER}";'),
    ("no secret in http://registry:8081 here", "no secret in http://registry:8081 here"),
]


@pytest.mark.parametrize(("text", "shown"), TEXTS)
def test_credentials_in_urls_and_tokens_are_replaced_anywhere(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_a_urls_password_is_replaced_even_when_quoted_without_the_url() -> None:
    settings = {"url": f"https://alice:{SECRET}@registry"}
    assert redact(f"login alice:{SECRET} refused; password {SECRET}", settings) == (
        f"login {PLACEHOLDER} refused; password {PLACEHOLDER}"
    )
    assert shown_settings(settings) == {"url": f"https://{PLACEHOLDER}@registry"}


# --- the Schema Registry options -----------------------------------------------------------------


def test_the_parsed_registry_configuration_never_shows_credentials() -> None:
    user_info = debezium_avro.DebeziumAvroConfig.from_options(
        {"url": "mock://repr", "basic-auth.user-info": f"bob:{SECRET}"}, None
    )
    in_url = FACTORY.create_decoder({"url": f"mock://alice:{SECRET}@repr"}).config
    token = debezium_avro.DebeziumAvroConfig.from_options(
        {"url": "mock://repr", "bearer-auth.token": SECRET, "bearer-auth.logical-cluster": "lsrc-1"}, None
    )
    for config in (user_info, in_url, token):
        assert SECRET not in repr(config)
        assert PLACEHOLDER in repr(config)
        assert redacted_repr(config) == repr(config)
    assert f"('basic.auth.user.info', '{PLACEHOLDER}')" in repr(user_info)
    assert f"('url', 'mock://{PLACEHOLDER}@repr')" in repr(in_url)


def test_an_invalid_registry_url_with_credentials_is_refused_without_them() -> None:
    with pytest.raises(FormatOptionError) as error:
        FACTORY.create_decoder({"url": f"ftp://alice:{SECRET}@registry"})
    assert "Invalid url ftp://" in str(error.value)
    assert SECRET not in str(error.value)
    assert f"ftp://{PLACEHOLDER}@registry" in str(error.value)


def test_an_unreachable_registry_with_credentials_is_named_without_them() -> None:
    url = f"http://alice:{SECRET}@127.0.0.1:9"
    debezium_avro.registry_client((("url", url),))._rest_client.max_retries = 0  # keep the test fast
    decoder = FACTORY.create_decoder({"url": url})
    with pytest.raises(FormatError) as error:
        decoder.decode_all(messages()[:1])
    assert f"cannot reach the Schema Registry at http://{PLACEHOLDER}@127.0.0.1:9" in str(error.value)
    assert SECRET not in str(error.value)


def test_a_missing_schema_becomes_a_dead_letter_without_the_credentials() -> None:
    decoder = FACTORY.create_decoder({"url": f"mock://alice:{SECRET}@dead", "ignore-parse-errors": "true"})
    out = decoder.decode_all(messages(schema_id=77)[:1])
    [letter] = out.dead_letters
    assert f"schema id 77 is not in the Schema Registry at mock://{PLACEHOLDER}@dead" in letter.reason
    assert SECRET not in letter.reason


class _EchoingRegistry(JsonHandler):
    """A registry (or proxy) whose refusal quotes the credentials it was sent, as some do."""

    def answer(self) -> tuple[int, dict[str, Any]]:
        header = self.headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        quoted = base64.b64decode(value).decode() if scheme == "Basic" else value
        return 401, {"error_code": 40101, "message": f"Unauthorized: {scheme} {quoted}"}


@pytest.fixture(scope="module")
def echoing_registry() -> Iterator[str]:
    with serving(_EchoingRegistry) as port:
        yield f"http://127.0.0.1:{port}"


CREDENTIALS = [
    {"basic-auth.user-info": f"alice:{SECRET}"},
    {
        "bearer-auth.token": SECRET,
        "bearer-auth.logical-cluster": "lsrc-1",
        "bearer-auth.identity-pool-id": "p",
    },
]


@pytest.mark.parametrize("credentials", CREDENTIALS, ids=["basic-auth", "bearer-auth"])
def test_a_refusal_quoting_the_credentials_is_reported_without_them(
    echoing_registry: str, credentials: dict[str, str]
) -> None:
    decoder = FACTORY.create_decoder({"url": echoing_registry, **credentials})
    with pytest.raises(FormatError) as error:
        decoder.decode_all(messages(schema_id=5)[:1])
    assert "refused schema id 5: Unauthorized" in str(error.value)
    assert SECRET not in str(error.value)
    assert PLACEHOLDER in str(error.value)


def test_a_short_secret_is_replaced_where_it_stands_alone_not_inside_words() -> None:
    settings = {"bearer.auth.token": "t", "sasl.password": "abc"}
    assert redact("missing bearer.auth.logical.cluster; token t; abc!", settings) == (
        f"missing bearer.auth.logical.cluster; token {PLACEHOLDER}; {PLACEHOLDER}!"
    )
