"""The store of ``test_spark_equivalence.py`` (the sample data and a generated run, ``_data.py``),
made in a process of its own while this process runs the other Spark tests.

Making it (the testbed through the OTel SDK and the collector's decoder, then DuckDB's build of
every relation) is Python and DuckDB work, 30 to 45 s; ``test_rewrites.py``, which runs first in
the same xdist group (so the same worker), is mostly the JVM's. When a test of the equivalence
module is among the tests to run, the first Spark test's setup starts making the store, and the
equivalence fixture waits for it: the two overlap instead of following each other.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENCE_MODULE = "tests/spark/test_spark_equivalence.py"

_SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.spark._data import make_store
make_store(Path(sys.argv[2]), int(sys.argv[3]))
"""


class Generation:
    """A store being made at ``path`` by a child process (:func:`tests.spark._data.make_store`)."""

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
        assert code == 0, f"making the store failed ({code}): {self.log.read_text()[-4000:]}"
        return self.path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def compared_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Generation]:
    """The sample data and the generated run in one store, started now and made in the
    background (see the module's text)."""
    from tests.spark._data import REQUESTS

    generation = Generation(tmp_path_factory.mktemp("spark_store") / "compared.duckdb", REQUESTS)
    try:
        yield generation
    finally:
        generation.stop()


@pytest.fixture(scope="session", autouse=True)
def _start_compared_store(request: pytest.FixtureRequest) -> None:
    """Before the first Spark test this process runs, start making the store when a test of
    ``test_spark_equivalence.py`` is to run too (selected, not deselected by ``-m`` or ``-k``).
    Under xdist only the worker given the ``spark`` group runs a test of this folder."""
    if any(item.nodeid.startswith(EQUIVALENCE_MODULE) for item in request.session.items):
        request.getfixturevalue("compared_store")
