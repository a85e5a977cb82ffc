import sys
from pathlib import Path

# The session's SparkSession (tests/connectors/spark_fixture.py): the in-process runs of stream and
# ingest (tests/cli_runner.py) use it.
sys.path.insert(0, str(Path(__file__).parent.parent / "connectors"))

from spark_fixture import spark  # noqa: E402, F401 - a session fixture
