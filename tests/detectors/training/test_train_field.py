"""species_detection_share against a hand count."""
import numpy as np
import pytest

from detectors.training.field import species_detection_share


def test_species_detection_share_by_hand():
    scores = np.array([0.1, 0.9, 0.2, 0.3, 0.8, 0.9, 0.95, 0.4, 0.5, 0.05])
    species = ["a", "a", "b", "b", "b", "c", "c", "d", "d", None]
    # threshold 0.45 flags: a 1/2, b 2/3, c 0/2, d 1/2 (0.4 < 0.45, 0.5 not); None ignored
    out = species_detection_share(scores, species, 0.45)
    assert out["per_species"] == pytest.approx({"a": 0.5, "b": 2 / 3, "c": 0.0, "d": 0.5})
    assert out["n_species"] == 4 and out["n_images"] == 9
    assert out["any"] == pytest.approx(3 / 4)  # a, b, d
    assert out["majority"] == pytest.approx(1 / 4)  # only b has strictly more than half
    assert out["mean_flagged"] == pytest.approx((0.5 + 2 / 3 + 0 + 0.5) / 4)
    only = species_detection_share(scores, species, 0.45, novel_species=["b", "c"])
    assert only["any"] == pytest.approx(0.5) and only["n_images"] == 5


def test_species_detection_share_errors():
    with pytest.raises(ValueError, match="entries"):
        species_detection_share([0.1, 0.2], ["a"], 0.5)
    with pytest.raises(ValueError, match="nothing"):
        species_detection_share([0.1], ["a"], 0.5, novel_species=["z"])
