import sys
from pathlib import Path

# The format golden cases (tests/formats/golden_cases.py) are read by the connector tests too.
sys.path.insert(0, str(Path(__file__).parent.parent / "formats"))

from kafka_fixture import kafka_cluster  # noqa: E402, F401 - a session fixture
from source_cases import products  # noqa: E402, F401 - a fixture of the source tests
from spark_fixture import spark  # noqa: E402, F401 - a session fixture
