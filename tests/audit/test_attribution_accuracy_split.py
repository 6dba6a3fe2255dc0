"""The accuracy benchmark's clear-cut split (benchmarks/attribution_accuracy.py): a ground-truth
verdict is clear-cut when it wins by a factor of 2 against every other verdict it could have
had (another cause's saving, or the significance bar below which it would be ``none``), decided
from the ground truth alone."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from testbed._config import LabelConfig

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "attribution_accuracy.py"


@pytest.fixture(scope="module")
def aa() -> Any:
    spec = importlib.util.spec_from_file_location("attribution_accuracy_split", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def truth_row(rid: str, primary: str, ttft: float | None = 3000.0, slow: bool = True,
              outcome: str = "routed", **cause_ms: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {"request_id": rid, "primary_cause": primary, "slow": slow,
                           "outcome": outcome, "actual_ttft_ms": ttft, "stale_subcause": None}
    for c in ("misrouting", "eviction", "stale_telemetry", "overload", "slow_replica",
              "long_prompt"):
        row[f"cause_ms_{c}"] = cause_ms.get(c, 0.0)
    return row


def test_bar_is_the_ground_truths_own(aa: Any) -> None:
    labels = LabelConfig()
    # 0.15 x 3000 = 450 > 100
    assert aa.significance_bar_ms(truth_row("a", "overload"), labels) == pytest.approx(450.0)
    # short TTFT: the floor in ms
    assert aa.significance_bar_ms(truth_row("a", "overload", ttft=400.0), labels) == 100.0
    # cancelled before the first token: its lifetime to its end, else to its decision
    row = truth_row("a", "overload", ttft=None) | {"e2e_ms": 4000.0}
    assert aa.significance_bar_ms(row, labels) == pytest.approx(600.0)
    row = truth_row("a", "overload", ttft=None) | {"arrival_s": 1.0, "decided_s": 5.0}
    assert aa.significance_bar_ms(row, labels) == pytest.approx(600.0)
    # other labels, other bar
    other = LabelConfig(min_cause_ms=700.0)
    assert aa.significance_bar_ms(truth_row("a", "overload"), other) == 700.0
    # rejected: no TTFT, overload infinite
    rejected = truth_row("a", "overload", ttft=None, outcome="rejected", overload=None)
    assert aa.significance_bar_ms(rejected, labels) is None
    assert aa.savings_ms(rejected)["overload"] == math.inf


@pytest.mark.parametrize(("primary", "savings", "bar", "want"), [
    # twice the runner-up and twice the bar
    ("overload", {"overload": 1000.0, "long_prompt": 500.0}, 450.0, True),
    # just below twice the runner-up: a near tie of two causes
    ("overload", {"overload": 999.0, "long_prompt": 500.0}, 450.0, False),
    # far above every other cause but within 2x of the bar: close to 'none'
    ("overload", {"overload": 800.0, "long_prompt": 0.0}, 450.0, False),
    # every other cause below the bar does not make it clear-cut on its own
    ("misrouting", {"misrouting": 500.0, "overload": 400.0}, 450.0, False),
    # 'none': every saving at most half the bar
    ("none", {"overload": 225.0}, 450.0, True),
    ("none", {"overload": 226.0}, 450.0, False),
    # rejected: infinite overload, no bar
    ("overload", {"overload": math.inf, "long_prompt": 5000.0}, None, True),
])
def test_clear_cut_rule(aa: Any, primary: str, savings: dict[str, float], bar: float | None,
                        want: bool) -> None:
    assert aa.is_clear_cut(primary, savings, bar) is want


def test_split_and_scores(aa: Any, tmp_path: Path) -> None:
    rows = [
        truth_row("r1", "overload", overload=2000.0, long_prompt=100.0),     # clear-cut
        truth_row("r2", "overload", overload=700.0, long_prompt=600.0),      # near tie
        truth_row("r3", "long_prompt", overload=100.0, long_prompt=1500.0),  # clear-cut
        truth_row("r4", "none", overload=50.0),                              # clear-cut none
        truth_row("r5", "none", ttft=1000.0, slow=False),                    # not slow
    ]
    gt = tmp_path / "gt.jsonl"
    gt.write_text("".join(json.dumps(r) + "\n" for r in rows))
    truth = aa.load_truth(gt, LabelConfig())
    assert dict(zip(truth["request_id"], truth["gt_clear_cut"], strict=True)) == {
        "r1": True, "r2": False, "r3": True, "r4": True, "r5": False}
    audit = pl.DataFrame({
        "request_id": ["r1", "r2", "r3", "r4"],
        "audit_cause": ["overload", "long_prompt", "long_prompt", "overload"],
        "audit_sub_kind": [None] * 4, "audit_excess_ms": [1.0] * 4, "audit_evidence": ["e"] * 4,
        "audit_slow": [True] * 4,
    })
    df = aa.joined(audit, truth)
    cc = {r["cause"]: r for r in aa.scores(aa.clear_cut(df)).iter_rows(named=True)}
    every = {r["cause"]: r for r in aa.scores(df).iter_rows(named=True)}
    # all requests: r2 misjudged; clear-cut: r2 is not a case, r4 (clear-cut none) counts
    assert (every["overload"]["precision"], every["overload"]["recall"]) == (0.5, 0.5)
    assert (cc["overload"]["truth"], cc["overload"]["audit"], cc["overload"]["both"]) == (1, 2, 1)
    assert (every["long_prompt"]["precision"], cc["long_prompt"]["precision"]) == (0.5, 1.0)
    assert aa.goal_misses(aa.scores(aa.clear_cut(df)), 0.95, 0.9) == ["overload precision 0.50"]
    text = "\n".join(aa.report("t", df, {}, overall=True))
    assert "clear-cut 3" in text
    assert "below goal (all, clear-cut)" in text
