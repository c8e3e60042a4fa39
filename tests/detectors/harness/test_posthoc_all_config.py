"""configs/posthoc_all.yaml: every registered post-hoc detector, through the runner's own reader; the report prints
the paper's methods in the paper's order, the others after them."""
from __future__ import annotations

from pathlib import Path

import detectors
from detectors.harness.evaluate import EvalConfig
from detectors.harness.report.names import OPEN_INSECTS, SHIFTED_BRONZES

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "posthoc_all.yaml"


def test_the_config_runs_every_posthoc_detector():
    config = EvalConfig.from_yaml(CONFIG, ["model=org/own-classifier"])  # its local model folder does not exist here
    names = [spec.name for spec in config.specs()]
    assert sorted(names) == [n for n in detectors.available("posthoc") if n != "ensemble"]  # members: the user's
    assert {"entropy", "webo", "scale", "lts"} <= set(names) and config.protocol == "exact"


def test_the_report_orders_new_methods_after_the_papers():
    everything = detectors.available("posthoc")
    for paper in (OPEN_INSECTS, SHIFTED_BRONZES):
        ordered = paper.sorted(everything)
        known = [m for m in paper.order if m in everything]
        assert ordered[:len(known)] == known
        assert ordered[len(known):] == [m for m in everything if m not in paper.order]
        assert {"entropy", "lts", "scale", "webo"} <= set(ordered[len(known):])


def test_every_detector_that_all_names_passes_its_checks_with_its_defaults(tmp_path):
    """`detectors: all` (the demo's, configs/posthoc_all.yaml's) never names a detector that refuses its own defaults:
    the ensemble, whose members only the user can name, is left out."""
    from detectors.harness.runconfig import typed_params
    from detectors.registry import FAMILIES

    config = EvalConfig.from_dict({"id": str(tmp_path), "ood": [str(tmp_path)], "out": str(tmp_path / "run"),
                                   "families": list(FAMILIES)})
    names = [spec.name for spec in config.specs()]
    assert "ensemble" not in names and {"knn", "diffguard", "mcm", "oe"} <= set(names)
    for i, name in enumerate(names):
        typed_params(detectors.detector_class(name), {}, f"detectors[{i}].params")
