"""The dry run's cost estimate: rates from the --out's own ledger (working stretches only), else from
benchmarks/fetch.json, else a line saying there is none; the slowest host sets the time."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from pipelines.curation.fetch_client import host_of
from pipelines.curation.fetch_estimate import BENCH, ledger_rates
from pipelines.curation.fetch_estimate import estimate as estimate_hosts


def estimate(urls, records, bench):
    return estimate_hosts(Counter(map(host_of, urls)), records, bench=bench)


def ok(host: str, i: int, t: float, size: int = 1000) -> tuple[str, dict]:
    url = f"http://{host}/{i}.jpg"
    return url, {"url": url, "status": "ok", "bytes": size, "t": t}


def test_the_ledger_gives_each_host_its_rate_over_working_stretches_only():
    records = dict([ok("a", i, 1000.0 + i * 0.5) for i in range(20)] +  # 2/s ...
                   [ok("a", 100 + i, 5000.0 + i * 0.5) for i in range(20)] +  # ... again after a long gap
                   [ok("b", i, 1000.0 + i * 0.1, 3000) for i in range(21)])  # 10/s
    rates, per_image, finished = ledger_rates(records)
    assert rates == pytest.approx({"a": 2.0, "b": 10.0}) and finished == 61
    assert per_image == pytest.approx((40 * 1000 + 21 * 3000) / 61)
    todo = [f"http://a/x{i}.jpg" for i in range(100)] + [f"http://b/x{i}.jpg" for i in range(300)] + \
        [f"http://c/x{i}.jpg" for i in range(10)]
    got = estimate(todo, records, bench=BENCH)
    assert got["source"] == "this --out's ledger (61 finished images)"
    assert got["seconds"] == pytest.approx(50.0) and got["slowest_host"] == "a"  # a: 100 / 2; b: 300 / 10; c: median
    assert got["disk_bytes"] == int(410 * per_image) and "50 s" in got["text"]


def test_without_a_ledger_the_benchmark_figures_are_used_and_said(tmp_path):
    bench = tmp_path / "fetch.json"
    bench.write_text(json.dumps({"estimate_inputs": {"images_per_s_per_host": 40.0, "bytes_per_image": 50000,
                                                     "host_allows_rps": 50}}))
    todo = [f"http://one.host/{i}.jpg" for i in range(36_000)]
    got = estimate(todo, {}, bench=bench)
    assert got["source"] == "benchmarks/fetch.json (a loopback host allowing 50 requests a second)"
    assert got["hours"] == pytest.approx(0.25)
    assert got["disk_bytes"] == 36_000 * 50000 and got["text"].startswith("about 15 minutes and 1.8 GB for 36000")
    few = dict(ok("a", i, float(i)) for i in range(5))  # too few finished images: still the benchmark's
    assert estimate(todo, few, bench=bench)["source"].startswith("benchmarks/fetch.json")
    missing = estimate(todo, {}, bench=tmp_path / "none.json")
    assert missing["source"] is None and missing["text"].startswith("no measured rate")
    assert estimate([], {}, bench=bench)["text"] == "nothing left to fetch"


@pytest.mark.slow  # two fetch_images processes
def test_the_benchmark_writes_the_figures_the_estimate_reads(tmp_path):
    from benchmarks import fetch as script
    out = tmp_path / "fetch.json"
    assert script.main(["--images", "12", "--side", "200", "--rps", "1000", "--repeats", "1", "--scenarios",
                           "fast,throttled", "--img2dataset-python", str(tmp_path / "none"), "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    ours = record["scenarios"]["throttled"]["best"]["ours"]
    assert ours["ok"] == 12 and ours["rc"] == 0 and record["img2dataset"] is None
    assert record["paper_estimate"]["images"] == 2_912_168 and record["estimate_inputs"]["host_allows_rps"] == 50
    got = estimate(["http://h/1.jpg"], {}, out)
    assert (got["source"].startswith("benchmarks/fetch.json")
            and got["bytes_per_image"] == round(ours["bytes_per_image"]))
