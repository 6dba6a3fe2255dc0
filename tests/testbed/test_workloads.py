from __future__ import annotations

import gzip
import lzma
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import WorkloadError
from testbed.workloads import (
    TRACE_DIR_ENV,
    TRACE_FILES,
    WORKLOADS,
    bursts,
    hot_prefix,
    load_aibrix,
    load_azure,
    load_mooncake,
    make_workload,
    read_trace,
    short_long_mix,
    uniform_short,
)

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE_LINES = [
    '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]}\n',
    '{"timestamp": 500, "input_length": 600, "output_length": 7, "hash_ids": [0, 1]}\n',
]


@pytest.fixture(autouse=True)
def _packaged_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts from the packaged traces, whatever the caller's environment says."""
    monkeypatch.delenv(TRACE_DIR_ENV, raising=False)


@pytest.mark.parametrize(("name", "rows"), [("mooncake", 12031), ("azure_code", 8820),
                                            ("azure_conv", 19367), ("aibrix", 320)])
def test_packaged_traces_are_complete(name: str, rows: int) -> None:
    where, lines = read_trace(name)
    assert Path(where) == ROOT / "testbed" / "data" / "traces" / (TRACE_FILES[name] + ".xz")
    assert len(lines) == rows  # the CSVs count their header line
    assert (Path(where).parent / "README.md").is_file()
    assert any(p.name.startswith("LICENSE-") for p in Path(where).parent.iterdir())


def test_every_trace_workload_loads_in_full() -> None:
    assert [len(make_workload(n)) for n in ("mooncake", "azure_code", "azure_conv", "aibrix")] == [
        12031, 8819, 19366, 320]


@pytest.mark.parametrize("suffix", ["", ".xz", ".gz"])
def test_trace_dir_overrides_plain_or_compressed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 suffix: str) -> None:
    data = "".join(MOONCAKE_LINES).encode()
    target = tmp_path / (TRACE_FILES["mooncake"] + suffix)
    target.parent.mkdir(parents=True)
    target.write_bytes({"": data, ".xz": lzma.compress(data), ".gz": gzip.compress(data)}[suffix])
    monkeypatch.setenv(TRACE_DIR_ENV, str(tmp_path))
    reqs = load_mooncake()
    assert [(r.request_id, r.arrival_s, r.input_tokens) for r in reqs] == [("mc-0", 0.0, 10),
                                                                          ("mc-1", 0.5, 600)]
    assert read_trace("mooncake")[0] == str(target)


def test_missing_trace_is_one_workload_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRACE_DIR_ENV, str(tmp_path))
    with pytest.raises(WorkloadError) as ei:
        load_azure(kind="code")
    msg = str(ei.value)
    assert msg == (f"{tmp_path / TRACE_FILES['azure_code']}: trace file not found, nor with .xz or .gz "
                   f"({TRACE_DIR_ENV} is set)")
    with pytest.raises(WorkloadError, match=r"nope\.jsonl: trace file not found$"):
        load_aibrix(str(tmp_path / "nope.jsonl"))
    with pytest.raises(WorkloadError, match="kind must be 'code' or 'conv'"):
        load_azure(kind="chat")


@pytest.mark.parametrize(("name", "content", "reason"), [
    ("t.jsonl.xz", lzma.compress(b"{}\n" * 100)[:40], "cannot read trace (Compressed data ended"),
    ("t.jsonl.gz", b"not gzip at all", "cannot read trace (Not a gzipped file"),
    ("t.jsonl", b"\xff\xfe{}\n", "cannot read trace ('utf-8' codec can't decode"),
])
def test_unreadable_trace_is_one_workload_error(tmp_path: Path, name: str, content: bytes,
                                                reason: str) -> None:
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(WorkloadError) as ei:
        load_mooncake(str(p))
    assert str(ei.value).startswith(f"{p}: {reason}") and "\n" not in str(ei.value)
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(WorkloadError, match=r"d\.jsonl: cannot read trace \(\[Errno 21\] Is a directory"):
        load_mooncake(str(tmp_path / "d.jsonl"))


def test_cli_prints_a_missing_trace_as_one_line(tmp_path: Path) -> None:
    env = {**os.environ, TRACE_DIR_ENV: str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "routeaudit", "demo", "--db", str(tmp_path / "x.duckdb"), "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"routeaudit demo: {tmp_path / TRACE_FILES['mooncake']}: trace file not found, nor with .xz "
        f"or .gz ({TRACE_DIR_ENV} is set)"]


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


def _own_traces(tmp_path: Path) -> tuple[Path, Path]:
    moon = tmp_path / "mine.jsonl"
    moon.write_text("".join(
        f'{{"timestamp": {i * 250}, "input_length": {600 + 10 * i}, "output_length": {20 + i}, '
        f'"hash_ids": [0, {i + 1}]}}\n' for i in range(12)))
    azure = tmp_path / "mine.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:15:{i:02d}.0000000,{300 + i},{10 + i}\n" for i in range(7)))
    return moon, azure


def test_own_traces_are_read_by_their_format(tmp_path: Path) -> None:
    from testbed.workloads import load_trace, trace_format

    moon, azure = _own_traces(tmp_path)
    assert trace_format(str(moon)) == "mooncake" and trace_format(str(azure)) == "azure"
    reqs = load_trace(str(moon))
    assert len(reqs) == 12 and reqs[3].input_tokens == 630 and reqs[3].output_tokens == 23
    assert reqs[-1].arrival_s == pytest.approx(11 * 0.25)
    assert len(load_trace(str(moon), limit=5)) == 5
    assert [r.input_tokens for r in load_trace(str(azure))] == list(range(300, 307))


@pytest.mark.parametrize("content, message", [
    ('{"timestamp": 0, "prompt": "hi"}\n', "needs Mooncake's fields"),
    ("a,b,c\n1,2,3\n", "not a trace this reads"),
    ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n{oops\n', "bad.trace:2: invalid JSON"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:00,x,1\n", "integers"),
])
def test_bad_own_traces_are_one_line_errors(tmp_path: Path, content: str, message: str) -> None:
    from testbed.workloads import load_trace

    bad = tmp_path / "bad.trace"
    bad.write_text(content)
    with pytest.raises(WorkloadError, match=re.escape(message)) as info:
        load_trace(str(bad))
    assert "\n" not in str(info.value) and str(bad) in str(info.value)


def test_demo_replays_an_own_trace(tmp_path: Path) -> None:
    moon, _ = _own_traces(tmp_path)
    db = tmp_path / "own.duckdb"
    out = subprocess.run([sys.executable, "-m", "routeaudit", "demo", "--quiet", "--db", str(db),
                          "--trace", str(moon)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"replayed 12 requests of {moon}" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "routeaudit", "demo", "--quiet", "--db", str(db),
                          "--trace", str(tmp_path / "missing.jsonl")], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
