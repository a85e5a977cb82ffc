"""Secrets kept out of messages, reprs, logs and files: one rule for Kafka client settings, Schema
Registry options and URLs.

A setting is secret when its key says so (passwords, secrets, tokens, JAAS and OAUTHBEARER
configuration, private keys, the registry's user info); its value is shown as ``***``. Credentials
in URLs (``https://user:password@host``, ``?token=...``) and bearer tokens are replaced wherever they
occur, whatever the setting.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

PLACEHOLDER = "***"

_SECRET_KEY = re.compile(
    r"password|secret|jaas|token|credential|private|keytab|keystore|\.pem|api[._-]?key|"
    r"(?:^|kafka\.)sasl\.oauthbearer\.|ssl[._-]key|user[._-]info",
    re.IGNORECASE,
)
# Secret values shorter than this are replaced only where they stand alone, not inside words.
_WHOLE_WORD_BELOW = 6
# Choices, not secrets: their values are words that also occur in ordinary messages.
_NOT_SECRET = frozenset({"sasl.oauthbearer.method", "bearer.auth.credentials.source"})
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/?#]*)@")
_URL_QUERY_SECRET = re.compile(
    r"(?P<key>[?&][^=&\s#]*(?:pass|secret|token|key|sig|auth|credential)[^=&\s#]*=)[^&\s#]+", re.IGNORECASE
)
_BEARER = re.compile(r"(?P<scheme>\bBearer|\bAuthorization:\s*Basic)(?P<space>\s+)[A-Za-z0-9._~+/\-]{6,}=*")
_ASSIGNED_SECRET = re.compile(
    r"(?P<key>\b[\w.\-]*(?:password|secret|token)[\w.\-]*\s*=\s*)(?P<quote>[\"']?)(?!\*\*\*)[^\s\"',;&)]+",
    re.IGNORECASE,
)


def is_secret(key: str) -> bool:
    """Whether the value of the setting or option ``key`` is a secret (``kafka.`` prefix or not)."""
    lowered = key.strip().lower()
    return lowered.removeprefix("kafka.") not in _NOT_SECRET and bool(_SECRET_KEY.search(lowered))


def shown_value(key: str, value: object) -> str:
    """``value`` as it may be shown: the placeholder for a secret, else with URL credentials removed."""
    if is_secret(key):
        return PLACEHOLDER
    return redact(str(value))


def shown_settings(settings: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> dict[str, str]:
    """The settings with every secret replaced by the placeholder, for reprs and messages."""
    pairs = settings.items() if isinstance(settings, Mapping) else settings
    return {str(key): shown_value(str(key), value) for key, value in pairs}


def redact(text: str, settings: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> str:
    """``text`` with the values of the secret ``settings``, URL credentials and bearer tokens replaced.

    ``settings`` are the options or client settings the text may quote (a library's error message
    echoes a value sometimes): their secret values are replaced wherever they occur, and so are the
    user info and password of any URL among them.
    """
    for secret in sorted(_secret_values(settings), key=len, reverse=True):
        if len(secret) >= _WHOLE_WORD_BELOW:
            text = text.replace(secret, PLACEHOLDER)
        else:  # a short secret also occurs inside ordinary words: replace it where it stands alone
            text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", PLACEHOLDER, text)
    text = _URL_USERINFO.sub(rf"\g<scheme>{PLACEHOLDER}@", text)
    text = _URL_QUERY_SECRET.sub(rf"\g<key>{PLACEHOLDER}", text)
    text = _BEARER.sub(rf"\g<scheme>\g<space>{PLACEHOLDER}", text)
    return _ASSIGNED_SECRET.sub(rf"\g<key>\g<quote>{PLACEHOLDER}", text)


def _secret_values(settings: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> set[str]:
    pairs = settings.items() if isinstance(settings, Mapping) else settings
    found: set[str] = set()
    for key, value in pairs:
        text = str(value) if value is not None else ""
        if not text:
            continue
        if is_secret(str(key)):
            found.update({text, unquote(text)})
        for match in _URL_USERINFO.finditer(text):
            userinfo = match["userinfo"]
            password = userinfo.partition(":")[2]
            found.update(part for part in (userinfo, unquote(userinfo), password, unquote(password)) if part)
    found.discard("")
    return found


def redacted_repr(obj: Any) -> str:
    """A dataclass's repr with its settings redacted: mappings and (key, value) pairs through
    :func:`shown_settings`, strings through :func:`redact`; other fields as their own repr."""
    shown = ", ".join(
        f"{field.name}={_shown(getattr(obj, field.name))}" for field in dataclasses.fields(obj) if field.repr
    )
    return f"{type(obj).__name__}({shown})"


def _shown(value: Any) -> str:
    if isinstance(value, Mapping):
        return repr(shown_settings(value))
    if isinstance(value, tuple) and value and all(_is_setting(item) for item in value):
        return repr(tuple(shown_settings(value).items()))
    if isinstance(value, str):
        return repr(redact(value))
    return repr(value)


def _is_setting(item: object) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
