"""Where the Delta sink's tables and checkpoint files live: local paths or object stores.

The target, the key-state table and the checkpoint may each be a local (or mounted) path or a URI of
S3 (``s3://``, ``s3a://``), ADLS / Azure Blob (``abfss://``, ``az://``, ...) or GCS (``gs://``).
:class:`Storage` holds the ``storage_options`` delta-rs takes (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AZURE_STORAGE_ACCOUNT_NAME``, ...; keys case-insensitive, as delta-rs
reads them), given on top of the same variables in the environment. The tables get the options as
given (delta-rs reads the environment itself); the small files of the checkpoint (Spark's query id,
the recorded application id) are read and written through pyarrow's file system of the same store,
built from the options and the environment alike.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from cdcflow.connectors.errors import ConnectorOptionError
from cdcflow.formats.redact import redact, redacted_repr

S3 = frozenset({"s3", "s3a"})
AZURE = frozenset({"az", "adl", "azure", "abfs", "abfss"})
GCS = frozenset({"gs", "gcs"})
_ALIASES = {
    "AWS_ACCESS_KEY_ID": ("ACCESS_KEY_ID",),
    "AWS_SECRET_ACCESS_KEY": ("SECRET_ACCESS_KEY",),
    "AWS_SESSION_TOKEN": ("AWS_TOKEN", "SESSION_TOKEN", "TOKEN"),
    "AWS_REGION": ("REGION", "AWS_DEFAULT_REGION", "DEFAULT_REGION"),
    "AWS_ENDPOINT_URL": ("AWS_ENDPOINT", "ENDPOINT", "ENDPOINT_URL"),
    "AWS_ALLOW_HTTP": ("ALLOW_HTTP",),
    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": ("VIRTUAL_HOSTED_STYLE_REQUEST",),
    "AZURE_STORAGE_ACCOUNT_NAME": ("ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT"),
    "AZURE_STORAGE_ACCOUNT_KEY": (
        "ACCOUNT_KEY",
        "AZURE_STORAGE_ACCESS_KEY",
        "ACCESS_KEY",
        "AZURE_STORAGE_MASTER_KEY",
    ),
    "AZURE_STORAGE_SAS_KEY": ("SAS_KEY", "AZURE_STORAGE_SAS_TOKEN", "SAS_TOKEN"),
    "AZURE_STORAGE_CLIENT_ID": ("AZURE_CLIENT_ID", "CLIENT_ID"),
    "AZURE_STORAGE_CLIENT_SECRET": ("AZURE_CLIENT_SECRET", "CLIENT_SECRET"),
    "AZURE_STORAGE_TENANT_ID": ("AZURE_TENANT_ID", "TENANT_ID", "AZURE_STORAGE_AUTHORITY_ID"),
    "AZURE_STORAGE_USE_EMULATOR": ("USE_EMULATOR", "AZURE_USE_EMULATOR"),
    "GOOGLE_SERVICE_ACCOUNT": ("SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "SERVICE_ACCOUNT_PATH"),
    "GOOGLE_SERVICE_ACCOUNT_KEY": ("SERVICE_ACCOUNT_KEY",),
}
_CANONICAL = {alias: name for name, aliases in _ALIASES.items() for alias in (name, *aliases)}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_S3_CODE = re.compile(r"<Code>(\w+)</Code>")


def scheme(uri: str) -> str:
    """The URI's scheme in lower case; "" for a local path (``file://`` included)."""
    head, sep, _ = uri.partition("://")
    if not sep or head.lower() == "file" or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", head):
        return ""
    return head.lower()


def is_remote(uri: str) -> bool:
    return scheme(uri) != ""


def join(base: str, *names: str) -> str:
    """``base`` with ``names`` appended: a local path joined by the OS, a URI with ``/``."""
    if not is_remote(base):
        return os.path.join(base.removeprefix("file://"), *names)
    return "/".join([base.rstrip("/"), *names])


def _true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Storage:
    """The ``storage_options`` of the stores a sink writes (delta-rs's keys), for tables and files."""

    options: Mapping[str, str] = field(default_factory=dict)
    _filesystems: dict[tuple[str, str | None], pafs.FileSystem] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __repr__(self) -> str:
        return redacted_repr(self)

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for key, value in self.options.items():
            if not isinstance(key, str) or not key.strip() or not isinstance(value, str):
                raise ConnectorOptionError(
                    f"storage option {redact(str(key))!r}: give storage options as KEY=VALUE text, e.g. "
                    "AWS_REGION=eu-west-1"
                )
            name = _canonical(key)
            if name in seen:
                raise ConnectorOptionError(
                    f"storage option {name} is given twice ({seen[name]} and {key}): keep one"
                )
            seen[name] = key

    def table_options(self) -> dict[str, str] | None:
        """``storage_options`` for delta-rs (None: its defaults and the environment)."""
        return dict(self.options) or None

    def setting(self, name: str, *, environment: bool = True) -> str | None:
        """The option ``name`` (a canonical key such as ``AWS_REGION``), given or from the environment."""
        for key, value in self.options.items():
            if _canonical(key) == name:
                return value
        if not environment:
            return None
        for alias in (name, *_ALIASES.get(name, ())):
            if alias.startswith(("AWS_", "AZURE_", "GOOGLE_")) and alias in os.environ:
                return os.environ[alias]
        return None

    def secrets(self) -> dict[str, str]:
        """The given options and the store variables of the environment, for
        :func:`~cdcflow.formats.redact.redact` of errors that may quote them."""
        found = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "AZURE_", "GOOGLE_"))}
        return {**found, **self.options}

    def check(self, uri: str, what: str) -> None:
        """Fail with the fix when ``uri`` is not a location this sink can write (called on the driver)."""
        kind = scheme(uri)
        if kind == "":
            return
        parts = urlsplit(uri)
        if kind not in S3 | AZURE | GCS:
            raise ConnectorOptionError(
                f"{what} {redact(uri)!r}: the Delta sink writes local paths and s3://, s3a://, abfss://, "
                "az://, gs:// URIs, not "
                f"{kind}://; use a local or mounted path or one of those stores"
            )
        if not parts.netloc:
            raise ConnectorOptionError(
                f"{what} {redact(uri)!r} names no bucket or container: write it as {kind}://BUCKET/path"
            )
        if parts.username or parts.password:
            raise ConnectorOptionError(
                f"{what} {redact(uri)!r}: credentials in the URI are not read; give them as storage "
                "options (--storage-option KEY=VALUE) or in the environment"
            )
        if kind in S3:
            if self.setting("AWS_S3_LOCKING_PROVIDER"):
                raise ConnectorOptionError(
                    f"{what} {redact(uri)!r}: AWS_S3_LOCKING_PROVIDER is set, but delta-rs 1.x has no "
                    "DynamoDB locking provider (it would commit without it): it commits with S3's "
                    "conditional writes, which AWS S3 and most S3-compatible stores support. Remove the "
                    "setting (storage option or environment)"
                )
            endpoint = self.setting("AWS_ENDPOINT_URL") or ""
            if endpoint.lower().startswith("http://") and not _true(self.setting("AWS_ALLOW_HTTP")):
                raise ConnectorOptionError(
                    f"{what} {redact(uri)!r}: the endpoint {redact(endpoint)} is plain HTTP, which delta-rs "
                    "refuses unless AWS_ALLOW_HTTP=true: add that storage option, or use an https:// endpoint"
                )
        if kind in GCS:
            given = {_canonical(k) for k in self.options}
            if given & {"GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_KEY"}:
                raise ConnectorOptionError(
                    f"{what} {redact(uri)!r}: the checkpoint's files on GCS are read with Google's default "
                    "credentials: set GOOGLE_APPLICATION_CREDENTIALS in the environment (delta-rs reads it "
                    "too) instead of the service account storage options"
                )

    def reachable(self, uri: str, what: str) -> None:
        """Fail with the store's reason when the table location ``uri`` cannot be listed."""
        if not is_remote(uri):
            return
        from deltalake import DeltaTable

        try:
            DeltaTable.is_deltatable(uri, storage_options=self.table_options())
        except (OSError, ValueError) as error:
            raise ConnectorOptionError(
                f"{what} {redact(uri)!r} cannot be reached: {self.reason(error)}. Check the bucket or "
                "container, the endpoint and the credentials (storage options or the environment)"
            ) from None

    def reason(self, error: BaseException) -> str:
        """A store's error in one line, without ANSI colours or secrets (S3: its error code)."""
        text = _ANSI.sub("", str(error))
        code = _S3_CODE.search(text)
        if code is not None:
            return code.group(1)
        lines = [line.strip(" ↳\t") for line in text.splitlines() if line.strip(" ↳\t")]
        if any("URL scheme is not allowed" in line for line in lines):
            return "plain HTTP is not allowed (set AWS_ALLOW_HTTP=true)"
        return redact(" / ".join(lines[-2:])[:300] or type(error).__name__, self.secrets())

    # --- small files (the checkpoint's) through pyarrow's file systems ------------------------------

    def filesystem(self, uri: str) -> tuple[pafs.FileSystem, str]:
        """pyarrow's file system of ``uri``'s store and the path of ``uri`` in it."""
        kind = scheme(uri)
        if kind == "":
            return pafs.LocalFileSystem(), os.path.abspath(uri.removeprefix("file://"))
        parts = urlsplit(uri)
        path = parts.path.strip("/")
        if kind in S3:
            return self._cached(("s3", None), self._s3), "/".join(filter(None, (parts.netloc, path)))
        if kind in AZURE:
            container, _, account_host = parts.netloc.partition("@")
            account = account_host.split(".", 1)[0] if account_host else None
            azure = self._cached(("azure", account), lambda: self._azure(account))
            return azure, "/".join(filter(None, (container, path)))
        return self._cached(("gcs", None), pafs.GcsFileSystem), "/".join(filter(None, (parts.netloc, path)))

    def _cached(self, key: tuple[str, str | None], make: Callable[[], pafs.FileSystem]) -> pafs.FileSystem:
        if key not in self._filesystems:
            self._filesystems[key] = make()
        return self._filesystems[key]

    def read_text(self, uri: str) -> str | None:
        """The file's text; None when it does not exist."""
        fs, path = self.filesystem(uri)
        try:
            with fs.open_input_stream(path) as handle:
                data: bytes = handle.read()
        except FileNotFoundError:
            return None
        return data.decode("utf-8")

    def write_text(self, uri: str, text: str) -> None:
        fs, path = self.filesystem(uri)
        if not is_remote(uri):
            fs.create_dir(os.path.dirname(path), recursive=True)
        with fs.open_output_stream(path) as handle:
            handle.write(text.encode("utf-8"))

    def exists(self, uri: str) -> bool:
        fs, path = self.filesystem(uri)
        return bool(fs.get_file_info(path).type != pafs.FileType.NotFound)

    def names(self, uri: str) -> list[str]:
        """The names of the entries in the directory ``uri`` (none when it is missing)."""
        fs, path = self.filesystem(uri)
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return [info.base_name for info in infos]

    def _s3(self) -> pafs.S3FileSystem:
        key, secret = self.setting("AWS_ACCESS_KEY_ID"), self.setting("AWS_SECRET_ACCESS_KEY")
        if bool(key) != bool(secret):
            raise ConnectorOptionError(
                "S3 credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY go together; give both (storage "
                "options or environment) or neither (the default credential chain: profile, web identity, "
                "instance role)"
            )
        return pafs.S3FileSystem(
            access_key=key or None,
            secret_key=secret or None,
            session_token=self.setting("AWS_SESSION_TOKEN") or None,
            region=self.setting("AWS_REGION") or None,
            endpoint_override=self.setting("AWS_ENDPOINT_URL") or None,
            force_virtual_addressing=_true(self.setting("AWS_VIRTUAL_HOSTED_STYLE_REQUEST")),
        )

    def _azure(self, account: str | None) -> pafs.FileSystem:
        name = self.setting("AZURE_STORAGE_ACCOUNT_NAME") or account
        if not name:
            raise ConnectorOptionError(
                "ADLS/Azure Blob: name the storage account (AZURE_STORAGE_ACCOUNT_NAME, or a URI "
                "abfss://CONTAINER@ACCOUNT.dfs.core.windows.net/path)"
            )
        extra: dict[str, str] = {}
        if _true(self.setting("AZURE_STORAGE_USE_EMULATOR")):
            extra = {
                "blob_storage_authority": "127.0.0.1:10000",
                "dfs_storage_authority": "127.0.0.1:10000",
                "blob_storage_scheme": "http",
                "dfs_storage_scheme": "http",
            }
        for option, name_ in (
            ("client_id", "AZURE_STORAGE_CLIENT_ID"),
            ("client_secret", "AZURE_STORAGE_CLIENT_SECRET"),
            ("tenant_id", "AZURE_STORAGE_TENANT_ID"),
            ("sas_token", "AZURE_STORAGE_SAS_KEY"),
        ):
            value = self.setting(name_)
            if value:
                extra[option] = value
        return pafs.AzureFileSystem(name, self.setting("AZURE_STORAGE_ACCOUNT_KEY") or None, **extra)


def _canonical(key: str) -> str:
    upper = key.strip().upper()
    return _CANONICAL.get(upper, upper)


LOCAL = Storage()
