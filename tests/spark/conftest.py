"""The generated run of ``test_spark_generated.py``, made in a process of its own while the
sample data's Spark build runs.

Making the run (the testbed through the OTel SDK and the collector's decoder, then DuckDB's
build of every relation) is Python and DuckDB work, about 25 s; the sample data's Spark build
before it (``test_spark_equivalence.py``, the same xdist group, so the same worker) is mostly
the JVM's. When the generated test is among the tests to run, the sample data's fixture starts
the run first, and the generated test's fixture waits for it: the two overlap instead of
following each other.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED_MODULE = "tests/spark/test_spark_generated.py"

_SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.spark.test_spark_generated import generate
generate(Path(sys.argv[2]), int(sys.argv[3]))
"""


class Generation:
    """A generated run being made at ``path`` by a child process."""

    def __init__(self, path: Path, requests: int) -> None:
        self.path = path
        self.log = path.with_suffix(".log")
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _SCRIPT, str(ROOT), str(path), str(requests)],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def wait(self) -> Path:
        """The store, once made (its relations built by DuckDB)."""
        code = self.proc.wait()
        assert code == 0, f"generating the run failed ({code}): {self.log.read_text()[-4000:]}"
        return self.path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def generated_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Generation]:
    """The generated run, started now and made in the background (see the module's text)."""
    from tests.spark.test_spark_generated import REQUESTS

    generation = Generation(tmp_path_factory.mktemp("spark_generated_run") / "generated.duckdb",
                            REQUESTS)
    try:
        yield generation
    finally:
        generation.stop()


def start_generated_run_if_wanted(request: pytest.FixtureRequest) -> None:
    """Start the generated run when a test of ``test_spark_generated.py`` is to run in this
    process (selected, not deselected by ``-m`` or ``-k``)."""
    if any(item.nodeid.startswith(GENERATED_MODULE) for item in request.session.items):
        request.getfixturevalue("generated_run")
