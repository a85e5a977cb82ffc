#!/usr/bin/env bash
# The test command: installs what it needs, then lint, types and tests. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
echo "== ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check -q .
echo "== mypy"; .venv/bin/mypy -p cdcflow
echo "== pytest"; .venv/bin/python -m pytest "$@"
