"""benchmarks/gpu.py on the CPU: its dry run end to end, the budget, JSON after every case, one shape per compile."""
from __future__ import annotations

import importlib
import json

import pytest


@pytest.fixture(scope="module")
def bench():
    return vars(importlib.import_module("benchmarks.gpu"))


def test_compiled_cases_get_one_fresh_build_per_batch_size(bench):
    args = bench["parse_args"](["--batch-sizes", "1,2,4", "--compile-batch-sizes", "1,4"])
    runs = bench["_zest_runs"](args, ["sdpa", "xformers"])
    assert runs == [("sdpa", False, [1, 2, 4]), ("xformers", False, [1, 2, 4]), ("sdpa", True, [1]),
                    ("sdpa", True, [4])]
    assert bench["_zest_runs"](bench["parse_args"](["--no-compile"]), ["sdpa"]) == [("sdpa", False, [1, 2, 4, 8])]
    assert bench["parse_args"]([]).budget_s == 420 and bench["parse_args"](["--no-budget"]).budget_s is None


def test_budget_estimates_from_the_last_case_of_a_kind_scaled_by_batch(bench):
    budget = bench["Budget"](100.0, {"compile-case": 150.0})
    assert budget.allows("eager-case", 4)[0]  # nothing known yet, no first guess: 0 s
    fits, why = budget.allows("compile-case", 1)
    assert not fits and why.startswith("budget: estimated 150 s")
    budget.record("eager-case", 10.0, batch=2)
    assert budget.estimate("eager-case", 8) == pytest.approx(40.0) and budget.estimate("eager-case", 1) == 10.0
    budget.started -= 95  # 5 s left
    assert budget.allows("eager-case", 1) == (False, "budget: estimated 10 s, 5 s left")
    assert bench["Budget"](None, {}).allows("compile-case", 8)[0]


@pytest.mark.slow
def test_dry_run_writes_the_json_after_every_case_and_skips_what_the_budget_cannot_hold(bench, tmp_path, monkeypatch,
                                                                                       single_torch_thread):
    writes = []
    save = bench["main"].__globals__["atomic_write_json"]

    def counting(path, obj):
        writes.append(json.loads(json.dumps(obj, default=str)))
        save(path, obj)

    monkeypatch.setitem(bench["main"].__globals__, "atomic_write_json", counting)
    out = tmp_path / "gpu.json"
    bench["main"](["--dry-run", "--sections", "zest", "--loop-images", "1", "--out", str(out)])
    result = json.loads((tmp_path / "gpu_dry_run.json").read_text())
    cases = result["sections"]["zest"]["cases"]
    assert [(c["case"], c["mode"], c["batch_size"]) for c in cases] == [("sdpa", "loop", 1), ("sdpa", "batched", 1),
                                                                        ("sdpa", "batched", 2)]
    assert all(c["images_per_s"] > 0 for c in cases) and cases[0]["speedup_vs_sdpa_loop"] == 1.0
    assert [len(w["sections"]["zest"]["cases"]) for w in writes] == [1, 2, 3, 3]  # after each case, then the section
    assert result["budget_s"] == 420 and result["elapsed_s"] < 420

    bench["main"](["--dry-run", "--sections", "zest", "--out", str(out), "--budget-s", "0"])
    skipped = json.loads((tmp_path / "gpu_dry_run.json").read_text())["sections"]["zest"]["cases"]
    assert [c["batch_size"] for c in skipped] == [1, 2] and all(c["skipped"].startswith("budget") for c in skipped)


def test_the_default_plan_measures_every_section_within_the_budget(bench):
    """From its own first guesses (one H200), the default run measures ZeST's one-at-a-time reference and batched
    cases, both DIFFGUARD parts and the training case, and its planned cases fit the 7-minute budget (8 with start-up):
    the later sections' cores are held back while ZeST runs."""
    args = bench["parse_args"]([])
    rows = bench["plan"](args)
    runs = [r for r in rows if r["runs"]]
    assert {r["section"] for r in runs} == {"zest", "diffguard", "train"}
    zest = [r["case"] for r in runs if r["section"] == "zest"]
    assert zest[0] == "sdpa build + one-at-a-time loop" and zest.count("sdpa") >= 2
    assert [r["case"] for r in runs if r["section"] == "diffguard"] == ["pixel (ADM 256)", "latent (SD 1.5)"]
    assert sum(r["estimate_s"] for r in runs) <= args.budget_s <= 8 * 60 - 60
    assert any(not r["runs"] for r in rows if r["section"] == "zest")  # the rest of ZeST's sweep gives way


def test_a_held_budget_keeps_the_later_sections_core(bench):
    budget = bench["Budget"](300.0, {"diffguard-pixel": 90.0, "diffguard-latent": 60.0, "train-resnet50": 120.0,
                                     "eager-case": 100.0})
    budget.hold(["diffguard", "train"])
    assert budget.held == 270.0
    fits, why = budget.allows("eager-case", 1)
    assert not fits and why.endswith("(270 s more held for the later sections)")
    budget.hold([])
    assert budget.allows("eager-case", 1)[0]
