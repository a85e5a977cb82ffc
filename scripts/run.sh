#!/usr/bin/env bash
# The main job on its embedded default. Extra args replace the default arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
if [ $# -eq 0 ]; then set -- ingest; fi
exec .venv/bin/python -m cdcflow "$@"
