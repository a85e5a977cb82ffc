"""``cdcflow stream``: a changelog read through a ``cdc-*`` Spark source, printed until the input
available at the start is read (see :func:`cdcflow.connectors.spark.jobs.stream_changelog`)."""

from __future__ import annotations

import argparse
import sys
from importlib import resources

from cdcflow.cli.common import (
    DUMP_EXAMPLE,
    CdcflowUsageError,
    add_input_flags,
    deprecated,
    kafka_timeout_option,
    key_values,
    merge_columns,
)

HELP = "print a changelog stream read through Spark"
DESCRIPTION = (
    "Read a changelog with a cdc-* Spark source, from Kafka or from recorded files, and "
    "print it until the input available at the start is read. Without input it replays the bundled "
    f"recording of real Debezium events from PostgreSQL ({DUMP_EXAMPLE})."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path_argument", nargs="?", metavar="path", help=argparse.SUPPRESS)  # deprecated
    parser.add_argument("--source", help=argparse.SUPPRESS)  # deprecated: --format
    add_input_flags(
        parser,
        path_help="recorded files: a topic dump or one envelope per line (default: the bundled recording)",
        format_help="debezium-json (default), debezium-avro-confluent, canal-json, maxwell-json, ogg-json, "
        "generic, upsert-kafka, debezium-json-registry",
        option_help="an option of the cdc-* source: connector (maxOffsetsPerTrigger=...), Kafka "
        "(kafka.*, startingOffsets=...) or format (schema-include=true) keys; repeatable",
    )
    parser.add_argument("--checkpoint", help="checkpoint directory (default: a temporary one)")
    parser.set_defaults(command=run)


def source_of(args: argparse.Namespace) -> str:
    """The ``cdc-*`` source of ``--format`` (or of the deprecated ``--source``)."""
    from cdcflow.connectors.spark.sources import source_formats, source_names

    by_format = source_names()
    if args.source is not None:
        formats = source_formats()
        deprecated("--source", f"--format {formats.get(args.source, 'FORMAT')}")
        if args.format is not None:
            raise CdcflowUsageError("give the format once: --format")
        return str(args.source)
    name = args.format or "debezium-json"
    if name not in by_format:
        raise CdcflowUsageError(f"--format {name!r} is not one of {', '.join(by_format)}")
    return by_format[name]


def run(args: argparse.Namespace) -> int:
    import tempfile

    from cdcflow.connectors.spark.jobs import (
        check_local_dir,
        check_source,
        local_session,
        session_is_active,
        spark_errors,
        stream_changelog,
    )

    if args.path_argument is not None:
        deprecated("'stream PATH'", "'stream --path PATH'")
        if args.path is not None:
            raise CdcflowUsageError("give the input once: --path PATH")
        args.path = args.path_argument
    source = source_of(args)
    options = key_values(args.option, "schema-include=true")
    merge_columns(options, args.schema, args.metadata)
    if args.bootstrap_servers:
        options["kafka.bootstrap.servers"] = args.bootstrap_servers
        options.setdefault("subscribe", ",".join(args.topic or []))
        options.setdefault("startingOffsets", "earliest")
    elif args.path:
        options["path"] = args.path
    else:
        example = resources.files("cdcflow.examples").joinpath(DUMP_EXAMPLE)
        options["path"] = str(example)
        options.setdefault("schema-include", "true")
    if any(key.strip().lower() == "kafka.bootstrap.servers" for key in options):
        kafka_timeout_option(options, args.kafka_timeout)
    if args.checkpoint:
        check_local_dir(args.checkpoint, "--checkpoint")
    check_source(source, options)
    with tempfile.TemporaryDirectory(prefix="cdcflow-checkpoint-") as scratch:
        started = not session_is_active()
        spark = local_session()
        try:
            with spark_errors():
                batches = stream_changelog(spark, source, options, args.checkpoint or scratch)
        finally:
            if started:  # a session the caller had (a notebook's) stays theirs
                spark.stop()
    print(f"cdcflow: {batches} micro-batch(es) read by {source}", file=sys.stderr)
    return 0
