"""The lakehouse tests run with the connector tests' fixtures and helper modules.

pytest applies tests/connectors/conftest.py to this folder too, so its fixtures (``spark``, the session
SparkSession; ``kafka_cluster``; ``products``) are not registered again here (a second registration
would be a second session-scoped fixture). This file makes the helper modules of tests/connectors
(``spark_rows``, ``cdc_events``, ...) and tests/core (``helpers``) importable as plain modules however
the tests are selected.
"""

import sys
from pathlib import Path

_TESTS = Path(__file__).parent.parent.parent
for folder in (_TESTS / "connectors", _TESTS / "core"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from s3_server import s3_bucket, s3_server, s3_spark  # noqa: E402, F401 - the S3 tests' fixtures
