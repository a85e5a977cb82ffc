#!/usr/bin/env bash
# Creates .venv (if missing) and installs cdcflow with its dev tools into it. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
pip_install() {
  if ! .venv/bin/python -m pip install -q --disable-pip-version-check "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "bootstrap: 'pip install $*' failed (output above)" >&2
    exit 1
  fi
}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
pip_install --upgrade "pip>=23" "setuptools>=77" wheel
# Strict editable mode links the folders into the cdcflow namespace, so mypy sees the package too.
pip_install --no-build-isolation --config-settings editable_mode=strict -e ".[dev]"
# Compiled once, as pip compiles a wheel it installs: where PYTHONDONTWRITEBYTECODE is set, every Python
# process Spark starts (a streaming query's planner, each worker) would compile cdcflow's modules again.
package=$(.venv/bin/python -c 'import cdcflow, os; print(os.path.dirname(cdcflow.__file__))')
.venv/bin/python -m compileall -q "$package" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
