from __future__ import annotations

import pytest

from testbed import Environment


@pytest.fixture
def env() -> Environment:
    return Environment()


@pytest.fixture
def log() -> list[tuple[object, ...]]:
    return []
