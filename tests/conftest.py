from pathlib import Path

import pytest

from pgserver import PostgreSQL

# The real Kubernetes control plane: fixtures kube_cluster (session) and kube (per test).
pytest_plugins = ["kube.fixtures"]

SHARED = Path(__file__).resolve().parents[2] / "shared"
EXAMPLES = Path(__file__).resolve().parents[1] / "jupyter_gpushare" / "sim" / "examples"


@pytest.fixture
def philly():
    trace = SHARED / "traces" / "philly.csv.gz"
    if not trace.exists():
        pytest.skip(f"the Philly trace is not at {trace}")
    return trace, SHARED / "traces" / "philly_quotas.csv"


@pytest.fixture
def example():
    return EXAMPLES / "small.csv", EXAMPLES / "small_quotas.csv"


@pytest.fixture(scope="session")
def postgresql():
    """The tests' own PostgreSQL server (tests/pgserver.py), for the whole run."""
    server = PostgreSQL()
    yield server
    server.stop()
