"""The ``cdcflow`` command line: ``ingest`` (the main job), ``inspect``, ``record`` and ``stream``.

One module per command; :mod:`cdcflow.cli.common` holds the flags they spell alike (``--path``,
``--bootstrap-servers``/``--topic``, ``--format``, ``--schema``, ``--metadata``, ``--option``) and the
one syntax of durations.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
from collections.abc import Sequence
from typing import Any

from cdcflow.cli import ingest, inspect, record, stream
from cdcflow.cli.common import CdcflowUsageError
from cdcflow.core import CdcflowError
from cdcflow.formats.redact import entry_settings, redact

__all__ = ["CdcflowUsageError", "exit_code", "main", "parser"]

KAFKA_LOGGER = "cdcflow.connectors.kafka"
"""The logger of librdkafka's lines (broker connections, retries); its ``.offsets`` child says what
``failOnDataLoss=false`` skipped, a warning kept."""
DESCRIPTION = "The cdcflow command line: ingest (the main job), inspect, record and stream."


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(parser(), argv)
    _log_to_stderr(verbose=args.verbose)
    try:
        return int(args.command(args))
    except CdcflowError as error:
        print(f"cdcflow: {redact(str(error), _given_options(args))}", file=sys.stderr)
        return exit_code(error)
    except KeyboardInterrupt:
        print("cdcflow: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def parser() -> argparse.ArgumentParser:
    """The command line's parser: one subcommand per module of this package."""
    root = argparse.ArgumentParser(prog="cdcflow", description=DESCRIPTION)
    commands = root.add_subparsers(required=True, metavar="COMMAND")
    for command in (inspect, record, stream, ingest):
        name = command.__name__.rpartition(".")[2]
        sub = commands.add_parser(name, help=command.HELP, description=command.DESCRIPTION)
        command.add_arguments(sub)
        sub.add_argument(
            "--verbose", action="store_true", help="Spark's and Kafka's own logging (default: errors only)"
        )
    return root


_parser = parser  # the name tests and older callers import


def exit_code(error: CdcflowError) -> int:
    """2 for a usage error (an option, flag or setting to fix), 1 for a failure of the run itself."""
    from cdcflow.connectors.errors import ConnectorOptionError
    from cdcflow.core.errors import ChangelogValidationError
    from cdcflow.formats.errors import FormatOptionError, UnknownFormatError

    usage = (ChangelogValidationError, FormatOptionError, UnknownFormatError, ConnectorOptionError)
    return 2 if isinstance(error, usage) or getattr(error, "usage_error", False) else 1


def _log_to_stderr(*, verbose: bool = False) -> None:
    """Warnings of cdcflow as ``cdcflow: ...`` lines; Kafka clients' (each logged once) and Spark's
    errors only, unless ``verbose`` (then cdcflow's INFO lines and Spark's own log settings)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("cdcflow: %(message)s"))
    root = logging.getLogger("cdcflow")
    if not root.handlers:
        root.addHandler(handler)
        root.propagate = False
    root.setLevel(logging.INFO if verbose else logging.WARNING)  # Spark follows: see verbose_spark()
    logging.getLogger(KAFKA_LOGGER).setLevel(logging.NOTSET if verbose else logging.ERROR)
    logging.getLogger(f"{KAFKA_LOGGER}.offsets").setLevel(logging.NOTSET if verbose else logging.WARNING)
    # Py4J logs the traceback of a failed foreachBatch call and of a call cut short by Ctrl-C (some on
    # the root logger): the query's error, or the interrupted run's summary, says what happened.
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    if not logging.root.handlers:
        other = logging.StreamHandler(sys.stderr)
        other.addFilter(lambda record: "py4j" not in record.pathname)
        logging.root.addHandler(other)


def _parse(root: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; argparse's errors echo some (unrecognized, bad choices): shown without secrets."""
    given = list(sys.argv[1:] if argv is None else argv)
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = root.parse_args(given)
    finally:
        sys.stderr.write(redact(errors.getvalue(), entry_settings(given)))
    args.given_arguments = given
    return args


def _given_options(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """The settings of the command line and its config file, whose secrets no message may show."""
    given = entry_settings(getattr(args, "given_arguments", None) or getattr(args, "option", None) or [])
    return [*given, *dict(getattr(args, "config_options", None) or {}).items()]
