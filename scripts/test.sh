#!/usr/bin/env bash
# The test command: installs what it needs (Python venv, the JVM jars of the test stack, PostgreSQL 15),
# then lint, types and tests. Extra args go to pytest. Idempotent; a re-run skips what is in place.
# See docs/testing.md ("What the test command installs").
set -euo pipefail
cd "$(dirname "$0")/.."

step_start=$SECONDS
step() { echo "== $1"; step_start=$SECONDS; }
took() { echo "   ($((SECONDS - step_start)) s)"; }

step "python environment (scripts/bootstrap.sh)"
bash scripts/bootstrap.sh
took

# Kafka broker and Connect, Debezium's PostgreSQL plugin, Spark's Kafka source, Delta, and S3A
# (hadoop-aws with the AWS SDK modules it loads, 13 MB: Spark's checkpoint on the S3 tests' server):
# from Maven Central into ${CDCFLOW_JAVA_CACHE:-~/.cache/cdcflow-java}.
step "JVM components (scripts/java_deps.sh)"
java_log=$(mktemp)
if ! bash scripts/java_deps.sh kafka connect debezium spark-kafka delta hadoop-aws >/dev/null 2>"$java_log"; then
  cat "$java_log" >&2
  rm -f "$java_log"
  exit 1
fi
grep -v 'up to date$' "$java_log" || true
rm -f "$java_log"
took

PG_BIN=${CDCFLOW_PG_BIN:-/usr/lib/postgresql/15/bin}
if [ ! -x "$PG_BIN/initdb" ]; then
  step "PostgreSQL 15 (apt-get install postgresql-15)"
  if [ "$(id -u)" -ne 0 ]; then
    echo "test.sh: PostgreSQL 15 is missing ($PG_BIN/initdb) and this is not root:" >&2
    echo "  run 'sudo apt-get install -y --no-install-recommends postgresql-15' (Debian 12), or set" >&2
    echo "  CDCFLOW_PG_BIN to a folder with PostgreSQL 15's initdb, pg_ctl and postgres" >&2
    exit 1
  fi
  apt_log=$(mktemp)
  export DEBIAN_FRONTEND=noninteractive
  if ! { apt-get install -y -q --no-install-recommends postgresql-15 >"$apt_log" 2>&1 \
      || { apt-get update -q >>"$apt_log" 2>&1 \
           && apt-get install -y -q --no-install-recommends postgresql-15 >>"$apt_log" 2>&1; }; }; then
    cat "$apt_log" >&2
    rm -f "$apt_log"
    echo "test.sh: installing postgresql-15 failed (apt output above)" >&2
    exit 1
  fi
  rm -f "$apt_log"
  if [ ! -x "$PG_BIN/initdb" ]; then
    echo "test.sh: postgresql-15 is installed but $PG_BIN/initdb is not there (CDCFLOW_PG_BIN?)" >&2
    exit 1
  fi
  "$PG_BIN/postgres" --version
  took
fi

# The class-data-sharing archive the suite's Spark drivers map (tests/jvm_options.py): written once per
# virtualenv, Java, Spark and Delta jars, by the demo ingest on the Spark back end (60-80 s).
step "Spark class archive (tests/jvm_options.py)"; .venv/bin/python tests/jvm_options.py; took
step "ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check -q .; took
step "mypy"; .venv/bin/mypy -p cdcflow; took
# Two pytest-xdist workers (the machine kind has 2 cores; much of a test's time is a child JVM starting or
# a broker answering). Tests that share a session service (PostgreSQL with Connect, the standalone
# cluster) run on one worker (tests/conftest.py). CDCFLOW_TEST_WORKERS=0 runs in this process.
workers=${CDCFLOW_TEST_WORKERS:-2}
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
step "pytest"; .venv/bin/python -m pytest "${parallel[@]}" --durations=30 "$@"
