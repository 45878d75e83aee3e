"""The shapes ``benchmarks/run.py`` writes (issue 19 items 6 and 7): ``--json`` keeps its keys
so runs compare, and ``--scaling``'s rows, table, growth and chart (a real matplotlib PNG).

The numbers here are made up: the benchmarks themselves run only by hand (no timing in
tests); what is checked is what a reader of the JSON and the table relies on."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def modules() -> tuple[Any, Any]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_scaling
        import run
    finally:
        sys.path.remove(str(BENCHMARKS))
    return run, bench_scaling


def result(median: float, unit: str = "s") -> dict[str, object]:
    return {"median": median, "min": median, "max": median, "n": 1, "unit": unit}


def test_json_keeps_its_keys(modules: tuple[Any, Any]) -> None:
    run, _ = modules
    ours = {"W2": result(0.0001), "W5 first": result(0.2), "W8": {"na": "no uv"}}
    floors = {"W2": result(0.00001), "W5 first": result(0.15)}
    data = run.result_data(time.time(), (1.0, 1.0, 1.0), True, ours, floors, {})
    assert set(run.JSON_KEYS) <= data.keys()
    assert {"ours", "floors", "peers"} <= data.keys()
    again = json.loads(json.dumps(data))
    assert again["ours"]["W5 first"]["median"] == 0.2
    assert again["floors"]["W2"]["median"] == 0.00001
    assert again["machine"]["loadavg_start"] == [1.0, 1.0, 1.0]
    assert "| W5 working_dir" in run.table(data)
    with pytest.raises(ValueError, match="W4: a result without a median"):
        run.result_data(time.time(), (1.0, 1.0, 1.0), True, {"W4": {"min": 1}}, {}, {})


def test_scaling_rows_table_growth_and_chart(modules: tuple[Any, Any], tmp_path: Path) -> None:
    _, scaling = modules
    curves = {
        "tasks": [
            {"n": 1000, "throughput": 9000.0, "per_task_s": 1e-4, "per_future_bytes": 2000.0},
            {"n": 10000, "throughput": 8000.0, "per_task_s": 1.2e-4, "per_future_bytes": 4000.0},
        ],
        "envs": [
            {"n": 10, "per_request_p99_s": 0.01},
            {"n": 1000, "per_request_p99_s": 0.011},
            {"n": 10000, "per_request_p99_s": 0.012},
        ],
    }
    growth = scaling.growth(curves["tasks"])
    assert growth == pytest.approx({"per_task_s": 1.2, "per_future_bytes": 2.0})
    assert "throughput" not in growth  # only per-unit measures have a target
    table = scaling.table(curves)
    assert "| tasks | per_task_s | 1,000: 100.0 µs, 10,000: 120.0 µs | 1.20x met |" in table
    assert "| tasks | per_future_bytes |" in table
    assert "2.00x **missed**" in table
    assert "| envs | per_request_p99_s | 10: 10.00 ms, 1,000: 11.00 ms, 10,000: 12.00 ms" in table
    png = tmp_path / "scaling.png"
    scaling.chart(curves, png, "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(scaling.SIZES) == {"tasks", "files", "envs", "kernels"}
