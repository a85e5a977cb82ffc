import os
import sys
from pathlib import Path

# Test helper modules (tests/core/helpers.py, ...) import as plain modules.
sys.path.insert(0, str(Path(__file__).parent / "core"))

# An exception that is not a record's fault (a bug in a format) is raised, not dead-lettered: tests
# never hide one (docs/formats.md, "Error handling"). Set before any SparkSession: executors inherit it.
os.environ.setdefault("CDCFLOW_STRICT_DECODE", "1")
