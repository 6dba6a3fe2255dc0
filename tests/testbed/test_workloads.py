from __future__ import annotations

import random
from pathlib import Path

import pytest

from testbed import WorkloadError
from testbed.workloads import (
    WORKLOADS,
    bursts,
    hot_prefix,
    load_aibrix,
    load_azure,
    load_mooncake,
    make_workload,
    short_long_mix,
    uniform_short,
)


def test_mooncake_loads_and_chains_block_zero() -> None:
    reqs = load_mooncake(limit=50)
    assert len(reqs) == 50
    assert len({r.block_keys[0] for r in reqs}) == 1  # every request shares block 0
    assert all(len(r.block_keys) == -(-r.input_tokens // 512) for r in reqs)
    assert reqs == sorted(reqs, key=lambda r: r.arrival_s)
    half = load_mooncake(limit=50, time_scale=0.5)
    assert half[-1].arrival_s == pytest.approx(reqs[-1].arrival_s / 2)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "invalid JSON"),
        ('{"timestamp": 0, "input_length": 600, "output_length": 5}', "must be a list of integers"),
        ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1]}', "needs 2"),
        ('{"timestamp": 0, "output_length": 5, "hash_ids": [1]}', "missing field 'input_length'"),
        ('{"timestamp": "x", "input_length": 10, "output_length": 5, "hash_ids": [1]}', "must be an integer"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_mooncake_bad_line(tmp_path: Path, line: str, reason: str) -> None:
    p = tmp_path / "t.jsonl"
    good = '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}'
    p.write_text(good + "\n" + line + "\n")
    with pytest.raises(WorkloadError) as ei:
        load_mooncake(str(p))
    assert str(ei.value).startswith(f"{p}:2: ") and reason in str(ei.value)
    assert ei.value.line == 2 and ei.value.path == str(p)


def test_azure_loads_and_reports_bad_lines(tmp_path: Path) -> None:
    reqs = load_azure(kind="code", limit=20)
    assert len(reqs) == 20 and reqs[0].arrival_s == 0.0
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:17:03.9799600,10,2\n"
                 "2023-11-16 18:17:04,abc,2\n")
    with pytest.raises(WorkloadError, match=r"a\.csv:3: token counts must be integers"):
        load_azure(str(p))
    p.write_text("when,a,b\n")
    with pytest.raises(WorkloadError, match=r":1: expected header"):
        load_azure(str(p))


def test_aibrix_prefix_share_from_text(tmp_path: Path) -> None:
    reqs = load_aibrix()
    assert len(reqs) == 320
    firsts = {r.block_keys[0] for r in reqs}
    assert len(firsts) < 60  # shared prefixes give shared first segments
    p = tmp_path / "b.jsonl"
    p.write_text('{"timestamp": 1, "requests": [{"Prompt Length": 5, "Output Length": 1}]}\n')
    with pytest.raises(WorkloadError, match=r"b\.jsonl:1: requests\[0\]\.prompt"):
        load_aibrix(str(p))


def test_synthetic_mixes_are_seeded() -> None:
    for fn in (uniform_short, short_long_mix, hot_prefix, bursts):
        a = fn(100, random.Random(1))
        b = fn(100, random.Random(1))
        assert a == b and len(a) >= 100
    mix = short_long_mix(500, random.Random(2))
    assert {r.input_tokens for r in mix} == {128, 8192}
    hp = hot_prefix(200, random.Random(3))
    assert max(sum(r.block_keys[0] == k for r in hp) for k in {r.block_keys[0] for r in hp}) > 80
    assert set(WORKLOADS) >= {"mooncake", "azure_code", "azure_conv", "aibrix", "uniform_short",
                              "short_long_mix", "hot_prefix", "bursts"}
    assert len(make_workload("uniform_short", n_requests=10)) == 10
