"""The real stack (stack_fixtures.py): one PostgreSQL 15 server and one Kafka broker per session, Kafka
Connect workers."""

import sys
from pathlib import Path

_HERE = Path(__file__).parent
for folder in (_HERE, _HERE.parent, _HERE.parent / "lakehouse"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from stack_fixtures import connect_worker, postgres, stack_bootstrap  # noqa: E402, F401 - session fixtures
