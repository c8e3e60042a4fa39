"""The shipped Open-Insects region configs load with the runner's config reader and every detector builds."""
from pathlib import Path

import pytest

from detectors.evaluate import EvalConfig, detector_specs
from detectors.registry import detector_class

CONFIGS = Path(__file__).parents[3] / "configs"


@pytest.mark.parametrize("region", ["ne-america", "w-europe", "c-america"])
def test_region_config_loads_and_builds(region):
    config = EvalConfig.from_yaml(CONFIGS / f"species_{region}.yaml")
    assert config.id == f"splits/{region}" and config.aux == {"manifest": f"splits/{region}", "split": "train"}
    specs = detector_specs(config)
    names = [s.name for s in specs]
    for name in ("arpl", "godin", "udg", "mixoe", "energy_oe", "novel_branch", "extended", "confbranch", "logitnorm", "oe"):
        assert name in names
    for spec in specs:
        cls = detector_class(spec.name)
        if cls.family == "training":
            cls(**spec.params)  # the recipe defaults construct
    assert bool(config.threshold_transfer) == bool(config.field) == (region == "c-america")  # BCI is in Panama
    assert config.ood_val == {"manifest": f"splits/{region}", "split": "val", "sets": ["auxiliary"]}
    trained = [s for s in specs if detector_class(s.name).family == "training" and s.name != "rotpred"]
    assert all(s.rules == ["msp", "ebo", "mls", "react", "vim", "knn", "mds"] for s in trained)
