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
    # object store keys (delta-rs's storage options): account, access (not its id), SAS, master keys
    r"(?:account|access|sas|master)[._-]?key(?![._-]?id)|"
    r"(?:^|kafka\.)sasl\.oauthbearer\.|ssl[._-]key|user[._-]info",
    re.IGNORECASE,
)
# Secret values shorter than this are replaced only where they stand alone, not inside words.
_WHOLE_WORD_BELOW = 6
# Choices, not secrets: their values are words that also occur in ordinary messages.
_NOT_SECRET = frozenset({"sasl.oauthbearer.method", "bearer.auth.credentials.source"})
# user[:password]@ after a scheme, ended by the last "@" that a host name follows: a password may hold
# "@", "/", "?" or "#" unencoded. Bounded, so a long line costs linear time.
_HOST_FOLLOWS = r"(?=[A-Za-z0-9._~%:\[\]\-]*(?:[/?#\s,;'\"<>(){}|\\]|$))"
_URL_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)"
    r"(?P<userinfo>[^\s/?#:]{0,256}?:(?!\d*(?:[/?#\s]|$))[^\s]{0,512}?|[^\s/?#:]{0,256}?)@" + _HOST_FOLLOWS
)
_SENSITIVE_NAME = (
    r"(?:passw(?:or)?d|passphrase|secret|token|credentials?|user[._-]?info|"
    r"(?:api|access|secret|private)[._-]?key|sig(?:nature)?|auth(?:orization)?)"
)
# A query parameter or an assignment whose name ends with a secret word: "token_count=5" is not one.
_URL_QUERY_SECRET = re.compile(rf"(?P<key>[?&][^=&\s#]*{_SENSITIVE_NAME}=)[^&\s#]+", re.IGNORECASE)
_ASSIGNED_SECRET = re.compile(
    rf"(?P<key>\b[\w.\-]*{_SENSITIVE_NAME}(?![\w.\-])[\"']?\s*(?:=|:(?=\s*[\"']))\s*)(?!\*\*\*|[\"']\*\*\*)"
    r"(?P<value>\"[^\"\n]{0,512}\"|'[^'\n]{0,512}'|[^\s\"',;&)}]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(
    r"(?P<scheme>\bBearer|\bAuthorization:\s*Basic)(?P<space>\s+)(?P<token>[A-Za-z0-9._~+/\-]{6,}=*)"
)
# What follows "Bearer" in prose ("Bearer tokens", "Bearer authentication"): a word, not a token.
_ORDINARY_WORD = re.compile(r"[A-Za-z][a-z]{0,22}(?:-[a-z]{1,22})*[.\-]*")
_WORD_START = re.compile(r"(?<=[\s;=])[^\s;=]")
# A malformed KEY=VALUE entry as typed on a command line: the key, then "=", ":" or blanks.
_ENTRY = re.compile(r"(?P<key>\s*[^=:\s]*)(?P<sep>\s*[=:\s]\s*)?")


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
    text = _BEARER.sub(_hidden_token, text)
    return _ASSIGNED_SECRET.sub(_hidden_assignment, text)


def shown_entry(entry: str) -> str:
    """A command line's ``KEY=VALUE`` entry as it may be shown, even malformed (``KEY:VALUE``,
    ``KEY VALUE``): when it names a secret, only its key, the value as the placeholder."""
    if not is_secret(entry):
        return redact(entry)
    match = _ENTRY.match(entry)
    key, sep = (match["key"], match["sep"] or "") if match else (entry, "")
    if not sep:  # a key alone: no value to hide
        return entry
    return f"{key}{sep}{PLACEHOLDER}"


def entry_settings(entries: Iterable[str]) -> list[tuple[str, str]]:
    """Command-line arguments as the (key, value) pairs they may hold, for :func:`redact`: each one
    split at its first ``=``, ``:`` or blank, and each with the argument after it (``KEY VALUE``)."""
    given = [str(entry) for entry in entries]
    given += [entry.partition("=")[2] for entry in given if entry.startswith("-")]  # --option=KEY=VALUE
    pairs: list[tuple[str, str]] = []
    for entry, following in zip(given, [*given[1:], ""][: len(given)], strict=True):
        match = _ENTRY.match(entry)
        if match and match["sep"]:
            pairs.append((match["key"].strip(), entry[match.end() :]))
        elif following and not following.startswith("-"):
            pairs.append((entry, following))
    return pairs


def _hidden_token(match: re.Match[str]) -> str:
    if _ORDINARY_WORD.fullmatch(match["token"]):
        return match[0]
    return f"{match['scheme']}{match['space']}{PLACEHOLDER}"


def _hidden_assignment(match: re.Match[str]) -> str:
    value = match["value"]
    quote = value[0] if value[0] in "\"'" and len(value) > 1 and value[-1] == value[0] else ""
    return f"{match['key']}{quote}{PLACEHOLDER}{quote}"


def _secret_values(settings: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> set[str]:
    pairs = settings.items() if isinstance(settings, Mapping) else settings
    found: set[str] = set()
    for key, value in pairs:
        text = str(value) if value is not None else ""
        if not text:
            continue
        if is_secret(str(key)):
            found.update({text, unquote(text)})
            # A parser quotes a setting (JAAS, OAUTHBEARER) from the point where it stopped reading.
            rests = (text[start.start() :] for start in _WORD_START.finditer(text))
            found.update(rest for rest in rests if len(rest) >= _WHOLE_WORD_BELOW)
        found.update(_url_credentials(text))
    found.discard("")
    return found


def _url_credentials(text: str) -> set[str]:
    """The user info and password of each URL in a setting's value (``url`` may list several)."""
    found: set[str] = set()
    pieces = text.split(",")
    for piece in pieces if all("://" in piece for piece in pieces) else [text]:
        userinfos = [match["userinfo"] for match in _URL_USERINFO.finditer(piece)]
        if not userinfos and "://" in piece:  # a malformed URL: a blank or worse in the password
            userinfos = [piece.partition("://")[2].rpartition("@")[0]]
        for userinfo in userinfos:
            password = userinfo.partition(":")[2]
            # A parser that cuts the URL at an unencoded "/", "?", "#" or "@" quotes a piece of it.
            pieces = [piece for piece in re.split(r"[/?#@]", password) if len(piece) >= _WHOLE_WORD_BELOW]
            parts = (userinfo, unquote(userinfo), password, unquote(password), *pieces)
            found.update(part for part in parts if part)
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
