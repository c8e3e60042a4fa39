"""detectors.harness.sanity: one warning line for numbers that mean nothing (a head that is not the ID classes, ID
accuracy at chance or zero, one ID class, sets too small for AUROC to resolve 10 points), checked against known
answers, and through the runner."""
import logging
import math

import numpy as np
import pandas as pd
import pytest

from detectors.harness import sanity


@pytest.mark.parametrize("n_id,n_ood", [(1, 1), (10, 10), (750, 9), (3, 200)])
def test_hanley_mcneil_at_auroc_half_is_the_mann_whitney_null_variance(n_id, n_ood):
    """At A = 0.5, Q1 = Q2 = 1/3 and the formula is the exact null variance of the Mann-Whitney AUC,
    (n_id + n_ood + 1) / (12 n_id n_ood): an independent known answer."""
    exact = math.sqrt((n_id + n_ood + 1) / (12 * n_id * n_ood))
    assert sanity.hanley_mcneil_se(0.5, n_id, n_ood) == pytest.approx(exact, rel=1e-12)


def test_hanley_mcneil_by_hand_and_edges():
    # A = 0.9, 50 and 50: Q1 = 0.9 / 1.1, Q2 = 1.62 / 1.9; by hand in float64
    a, q1, q2 = 0.9, 0.9 / 1.1, 1.62 / 1.9
    hand = math.sqrt((a * (1 - a) + 49 * (q1 - a * a) + 49 * (q2 - a * a)) / 2500)
    assert sanity.hanley_mcneil_se(0.9, 50, 50) == pytest.approx(hand, rel=1e-12)
    assert sanity.hanley_mcneil_se(1.0, 9, 9) == 0.0  # why the size check takes the widest interval over A
    assert math.isnan(sanity.hanley_mcneil_se(0.7, 0, 10))
    half, at = sanity.widest_half_width(750, 9)
    fine = max(sanity.hanley_mcneil_se(a, 750, 9) for a in np.linspace(0.5, 1, 10001))
    assert half == pytest.approx(100 * sanity.Z95 * fine, rel=1e-3) and at == 50.0
    assert half == pytest.approx(100 * sanity.Z95 * math.sqrt(760 / (12 * 750 * 9)))  # the Mann-Whitney null one


def test_small_sets_are_named_with_their_interval_and_large_ones_are_not():
    results = pd.DataFrame({"method": ["msp", "msp", "ebo"], "ood_set": ["tiny", "big", "tiny"],
                            "n_id": [750, 750, 750], "n_ood": [9, 2000, 9]})
    lines = sanity.small_set_warnings(results)
    assert len(lines) == 1 and lines[0].startswith("OOD set 'tiny': 9 OOD against 750 ID images")
    assert f"+-{sanity.widest_half_width(750, 9)[0]:.1f} points" in lines[0] and "Hanley-McNeil" in lines[0]
    # equal sets resolve 10 points from about 257 images each: (2n + 1) / (12 n^2) = (5 / 1.96 / 100)^2
    assert 2 * sanity.widest_half_width(260, 260)[0] < 10 < 2 * sanity.widest_half_width(250, 250)[0]
    assert sanity.small_set_warnings(pd.DataFrame()) == []


def test_accuracy_zero_and_at_chance_warn_and_a_learned_one_does_not():
    results = pd.DataFrame({"method": ["msp", "ebo", "knn", "vim"], "id_acc": [0.0, 0.0, 0.22, 0.9]})
    lines = sanity.accuracy_warnings(results, classes=5, n_test=750)
    assert len(lines) == 2
    assert lines[0].startswith("ID test accuracy is 0.00% (msp, ebo)")
    assert lines[1].startswith("ID test accuracy 22.00% (knn) is at chance for 5 classes")
    # the chance ceiling by hand: 0.2 + 1.96 sqrt(0.16 / 750) = 0.2286...
    assert sanity.chance_ceiling(5, 750) == pytest.approx(0.2 + sanity.Z95 * math.sqrt(0.16 / 750))
    assert sanity.accuracy_warnings(results.assign(id_acc=np.nan), 5, 750) == []


def test_head_and_one_class_lines():
    assert sanity.head_warning(5, 5, "m") is None and sanity.one_class_warning(3) is None
    line = sanity.head_warning(10, 5, "runs/m")
    assert line.startswith("model runs/m: its head has 10 outputs but the ID set has 5 classes") and "\n" not in line
    assert "AUROC 50 by construction" in sanity.one_class_warning(1)
    assert sanity.id_classes([0, 0, -1, 0]) == 1


@pytest.mark.slow
def test_the_runner_warns_on_a_head_of_other_classes_and_small_sets(tmp_path, caplog, monkeypatch):
    from runner_helpers import id_ood_manifests

    from detectors.harness.evaluate import run_config
    from tests.helpers.models import tiny_resnet_classifier

    monkeypatch.setenv("OODFORGE_PROGRESS", "off")
    id_dir, ood_dir = id_ood_manifests(tmp_path / "data")  # 2 ID classes, 4 OOD images a set
    tiny_resnet_classifier(tmp_path / "model", classes=5, size=8)
    config = {"model": str(tmp_path / "model"), "id": str(id_dir), "ood": [{"manifest": str(ood_dir)}],
              "out": str(tmp_path / "out"), "detectors": ["msp"]}
    with caplog.at_level(logging.WARNING):
        run_config(config)
    warnings = [m for m in caplog.messages if m.startswith("[oodforge] warning: ")]
    assert any("its head has 5 outputs but the ID set has 2 classes" in m for m in warnings)
    assert any(m.startswith("[oodforge] warning: OOD set 'far': 4 OOD against 4 ID images") for m in warnings)
    assert all("\n" not in m for m in warnings)
    # the classifier's predicted class beside every score: an index as text, as 5 logits have no 2 class names
    scores = pd.read_parquet(tmp_path / "out" / "scores.parquet")
    assert scores["pred"].notna().all() and set(scores["pred"]) <= {str(i) for i in range(5)}


def test_a_model_trained_under_another_protocol_is_named(tmp_path):
    """The 81.33% (metrics.json) vs 81.20% (evaluate) of one checkpoint: trained under exact (bicubic processor
    pixels), evaluated under openood_v1.5 (the reference's bilinear resize)."""
    import json

    (tmp_path / "best").mkdir()
    (tmp_path / "train_config.json").write_text(json.dumps({"protocol": "exact"}))
    line = sanity.protocol_warning(str(tmp_path / "best"), "openood_v1.5")
    assert "trained and tested under protocol exact, this evaluation runs openood_v1.5" in line
    assert "set protocol: exact" in line and "\n" not in line
    assert sanity.protocol_warning(str(tmp_path), "exact") is None
    assert sanity.protocol_warning("microsoft/resnet-50", "exact") is None
    assert sanity.protocol_warning(None, "exact") is None
