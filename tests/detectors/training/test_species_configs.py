"""The shipped Open-Insects region configs load with the runner's config reader, list the paper's methods (Table 2
post-hoc, Table 7 training rows), and every training method builds in full mode (the default)."""
from pathlib import Path

import pytest
import yaml

from detectors.evaluate import EvalConfig, detector_specs
from detectors.registry import detector_class

CONFIGS = Path(__file__).parents[3] / "configs"
TABLE2 = ["openmax", "msp", "tempscale", "odin", "mds", "mdsens", "rmds", "gram", "ebo", "opengan", "gradnorm", "react",
          "mls", "klm", "vim", "knn", "dice", "rankfeat", "ash", "she", "neco", "fdbd", "rp_msp", "rp_odin", "rp_ebo",
          "rp_gradnorm"]
TABLE7 = ["confbranch", "logitnorm", "arpl", "godin", "rotpred", "oe", "mcd", "mixoe", "energy_oe", "udg", "novel_branch",
          "extended"]


@pytest.mark.parametrize("region", ["ne-america", "w-europe", "c-america"])
def test_region_config_lists_the_papers_methods_in_full_mode(region):
    config = EvalConfig.from_yaml(CONFIGS / f"species_{region}.yaml")
    assert config.id == f"splits/{region}" and config.aux == {"manifest": f"splits/{region}", "split": "train"}
    specs = detector_specs(config)
    names = [s.name for s in specs]
    assert names == TABLE2 + TABLE7
    for spec in specs:
        cls = detector_class(spec.name)
        if cls.family == "training":
            det = cls(**spec.params)  # the recipe defaults construct
            assert det.params["mode"] == "full" and det.inputs == frozenset({"images"})
            assert det.params["epochs"] == 30 and det.params["lr"] == 1e-3 and det.params["warmup_epochs"] == 2
            assert det.params["batch_size"] == (256 if spec.name == "rotpred" else 512)
            assert spec.rules == ["msp", "ebo", "mls", "react", "vim", "knn", "mds"]
    assert bool(config.threshold_transfer) == bool(config.field) == (region == "c-america")  # BCI is in Panama
    assert config.ood_val == {"manifest": f"splits/{region}", "split": "val", "sets": ["auxiliary"]}


def test_short_species_config_builds():
    raw = yaml.safe_load((CONFIGS / "eval_species.yaml").read_text())
    config = EvalConfig.from_yaml(CONFIGS / "eval_species.yaml")
    assert raw["ood_val"]["sets"] == ["auxiliary"]
    modes = {s.name: detector_class(s.name)(**s.params).params.get("mode") for s in detector_specs(config)}
    assert modes["novel_branch"] == "full" and modes["logitnorm"] == "heads"
