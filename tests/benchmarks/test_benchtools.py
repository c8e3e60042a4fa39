"""The benchmarks' shared helpers (benchmarks.cases.tools) and the pure parts of benchmarks/scale_data.py: what they
serve, count and compute (no timing is asserted)."""
import importlib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from benchmarks.cases.tools import LoopbackHost, best_of, cpu_model, peak_rss_mib, reset_peak_rss, torchvision_missing

ROOT = Path(__file__).resolve().parents[2]


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read(), answer.headers.get("Retry-After")
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers.get("Retry-After")


def test_host_serves_the_pool_by_index_and_counts_requests():
    with LoopbackHost(lambda i: b"image %d" % i) as host:
        assert _get(host.base + "/img/7.jpg?r=x")[:2] == (200, b"image 7")
        assert _get(host.base + "/nothing")[0] == 404
        assert host.requests == 2 and host.throttled == 0 and host.first is not None
        host.reset()
        assert host.requests == 0 and host.first is None
    with LoopbackHost([b"a", b"b"]) as host:
        assert _get(host.base + "/img/3.jpg")[1] == b"b"  # a list is served modulo its length


def test_a_host_allowing_no_requests_answers_only_429_with_retry_after():
    with LoopbackHost([b"a"], rps=0) as host:
        assert [_get(host.base + f"/img/{i}.jpg")[0::2] for i in range(3)] == [(429, "1")] * 3
        assert host.throttled == 3


def test_best_of_keeps_the_fewest_seconds_interleaved():
    calls, seconds = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 6.0, 4.0])}
    best = best_of(3, {k: (lambda k=k: calls.append(k) or next(seconds[k])) for k in seconds})
    assert best == {"a": 1.0, "b": 4.0} and calls == ["a", "b"] * 3
    assert best_of(1, {"timed": lambda: None})["timed"] >= 0


def test_peak_rss_and_a_missing_interpreter():
    reset_peak_rss()
    peak = peak_rss_mib()
    assert peak is None or peak > 0
    assert torchvision_missing(str(ROOT / "no-such-python")) is not None


def test_cpu_model_reads_the_model_name_or_falls_back(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\n\nprocessor\t: 1\n"
                    "model name\t: AMD EPYC 9B14\n")
    assert cpu_model(str(info)) == "AMD EPYC 9B14"
    info.write_text("processor\t: 0\nmodel name\t:\n")  # no name given: the platform's string
    assert cpu_model(str(info)) and cpu_model(str(info)) != ""
    assert cpu_model(str(tmp_path / "missing")) == cpu_model(str(info))
    assert cpu_model()  # this machine's


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.scale_data")


def test_bench_steady_rate_and_the_paper_estimates_by_hand(bench):
    assert bench.steady_rate([0.0, 1.0]) is None
    assert bench.steady_rate([float(t) for t in range(11)]) == pytest.approx(1.0)  # one image a second after 2 s
    peak = {"ours_peak_rss_mib": 400.0, "ours_draft_peak_rss_mib": 400.0}
    fetched = {"img_s_per_core": 10.0, "bytes_per_image": 20_000, "peak_rss_mib": 500.0}
    measured = {
        "splits": {"rows": 2_912_168, "columns": 130, "total_s": 20.0, "peak_rss_mib": 3072.0},
        "fetch": {"best": {"ours_reference": fetched, "ours_keep_ratio": fetched},
                  "throttled": {"throttle_efficiency": 0.9}},
        "shards": {"img_s_per_core": 1000.0, "shard_bytes_per_image": 22_000, "peak_rss_mib": 450.0},
        "loaders": {"originals": {"megapixels": 3.0, "train": {"ours_img_s": 60.0, "ratio": 1.5, **peak},
                                  "eval": {"ours_img_s": 30.0, "ours_draft_img_s": 70.0, "ratio": 1.1,
                                           "ratio_draft": 2.5, **peak}},
                    "fetched": {"megapixels": 0.07, "train": {"ours_img_s": 500.0, **peak},
                                "eval": {"ours_img_s": 600.0, "ours_draft_img_s": 700.0, **peak}}}}
    est = bench.paper_estimates(measured, cores=16, host_rps=50, gpu_img_s=10_000)
    images = 2_912_168
    # fetch: min(0.9 x 50, 16 x 10) = 45 img/s
    assert est["fetch"]["img_s"] == 45 and est["fetch"]["hours"] == round(images / 45 / 3600, 1)
    assert est["fetch"]["disk_gb"] == round(images * 20_000 / 1e9, 1)
    assert est["splits"] == {"rows": images, "peak_rss_gib": 3.0, "goal_gib": 4, "meets_goal": True}
    # 120 epochs on 15 workers at 500 img/s = 7,500 img/s, against 10,000 img/s on the GPU
    load = est["train_loading"]
    assert load["loader_img_s"] == 7500 and load["loading_hours"] == round(120 * images / 7500 / 3600, 1)
    assert load["gpu_hours"] == round(120 * images / 10_000 / 3600, 1) and load["meets_goal"] is False
    assert load["loader_cores_to_keep_pace"] == 20
    assert est["shards"]["hours"] == round(images / (1000 * 15) / 3600, 2)
    assert est["per_core_goals"]["train"]["meets_goal"] is True
    assert est["per_core_goals"]["eval"]["meets_goal_default"] is False and est["per_core_goals"]["eval"]["meets_goal"]
    assert bench.loader_rates(measured)[1] == {"what": "train loader, ami, fetched", "images_per_s_per_core": 500.0,
                                               "megapixels": 0.07, "draft": True}
    text = bench.table(measured, est)
    assert "| train (originals, 3 MP) | 60.0 | - | - | 1.50x | 400 |" in text and "fetch: 18.0 h at 45.0 img/s" in text


def test_bench_has_a_testable_main_on_the_shared_parser(bench, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(["--help"])
    assert stop.value.code == 0 and "--sample" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        bench.main(["--skip", "nothing"])
    assert stop.value.code == 2


def test_bench_fetch_estimate_falls_back_when_the_host_was_not_the_limit(bench, tmp_path, monkeypatch):
    measured = {"fetch": {"best": {"ours_reference": {"img_s_per_core": 10.0, "bytes_per_image": 1}},
                          "throttled": {"throttle_efficiency": None, "limited_by_host": False}}}
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    est = bench.paper_estimates(measured, cores=16, host_rps=50, gpu_img_s=1.0)["fetch"]
    assert ((est["throttle_efficiency"], est["img_s"]) == (1.0, 50.0)
            and est["throttle_efficiency_source"].startswith("assumed"))
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "fetch.json").write_text('{"paper_estimate": {"throttle_efficiency": 0.8}}')
    est = bench.paper_estimates(measured, cores=16, host_rps=50, gpu_img_s=1.0)["fetch"]
    assert ((est["throttle_efficiency"], est["img_s"]) == (0.8, 40.0)
            and "fetch.json" in est["throttle_efficiency_source"])
