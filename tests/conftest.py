import sys
from pathlib import Path

# Test helper modules (tests/core/helpers.py, ...) import as plain modules.
sys.path.insert(0, str(Path(__file__).parent / "core"))
