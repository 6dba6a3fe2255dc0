from __future__ import annotations

from testbed import Environment
from testbed._env import PRIO_ARRIVAL, PRIO_STEP, PRIO_TELEMETRY


def test_events_ordered_by_time_priority_sequence(env: Environment, log: list) -> None:
    rec = lambda who: log.append((who, env.now))  # noqa: E731
    env.at(1.0, PRIO_ARRIVAL, rec, "arrival@1")
    env.at(1.0, PRIO_STEP, rec, "step@1")
    env.at(0.5, PRIO_ARRIVAL, rec, "arrival@0.5")
    env.at(1.0, PRIO_TELEMETRY, rec, "poll@1")
    env.at(1.0, PRIO_STEP, rec, "step2@1")
    cancelled = env.at(0.7, PRIO_STEP, rec, "cancelled")
    cancelled.cancel()
    env.run()
    assert log == [
        ("arrival@0.5", 0.5), ("step@1", 1.0), ("step2@1", 1.0), ("poll@1", 1.0), ("arrival@1", 1.0),
    ]
    assert env.processed == 5


def test_counter_is_per_instance() -> None:
    a, b = Environment(), Environment()
    a.at(1.0, 0, lambda: None)
    ev = b.at(1.0, 0, lambda: None)
    assert ev.seq == 0


def test_run_until(env: Environment, log: list) -> None:
    env.at(1.0, 0, lambda: log.append(env.now))
    env.at(3.0, 0, lambda: log.append(env.now))
    env.run(until=2.0)
    assert log == [1.0] and env.now == 2.0
