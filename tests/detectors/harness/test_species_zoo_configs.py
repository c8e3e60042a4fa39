"""The shipped zoo configs (configs/species_zoo_<region>.yaml): the region file's paths and protocol, Table 2's
post-hoc methods as species_base.yaml lists them, and every training method of the zoo loading its own released file
(named as the zoo names it, for the network its detector reads), none trained."""
from pathlib import Path

import pytest
import torch

from detectors.harness.runconfig import EvalConfig
from detectors.registry import detector_class
from pipelines.configfile import load_yaml
from pipelines.zoo import METHOD_NETWORKS, parse_name

CONFIGS = Path(__file__).parents[3] / "configs"
REGIONS = ("ne-america", "w-europe", "c-america")


@pytest.mark.parametrize("region", REGIONS)
def test_zoo_config_loads_every_released_method(region, tmp_path):
    model = tmp_path / f"basics_{region}.pth"
    torch.save({"fc.weight": torch.zeros(2, 2)}, model)  # `model:` must exist to parse; its keys are the plan's
    config = EvalConfig.from_yaml(CONFIGS / f"species_zoo_{region}.yaml", [f"model={model}"])
    region_file = EvalConfig.from_yaml(CONFIGS / f"species_{region}.yaml", [f"model={model}"])
    assert (config.id, config.ood, config.aux, config.ood_val, config.protocol) == \
        (region_file.id, region_file.ood, region_file.aux, region_file.ood_val, region_file.protocol)
    assert load_yaml(CONFIGS / f"species_zoo_{region}.yaml")["model"] == f"weights/basics_{region}.pth"
    base = [s for s in region_file.detectors if detector_class(s.name).family != "training"]
    ours = [s for s in config.detectors if detector_class(s.name).family != "training"]
    assert [s.name for s in ours] == [s.name for s in base]
    assert [s.load for s in ours if s.load] == [f"weights/opengan_DNet_{region}.ckpt"]
    trained = [s for s in config.detectors if detector_class(s.name).family == "training"]
    assert sorted(s.name for s in trained) == sorted(s.name for s in region_file.detectors
                                                     if detector_class(s.name).family == "training" and s.name != "mcd")
    methods = set()
    for spec in trained:
        name = parse_name(spec.load)
        assert name is not None and name.region == region and spec.load.startswith("weights/"), spec.load
        assert METHOD_NETWORKS[name.method] == detector_class(spec.name).released_network, spec
        assert [r.name for r in spec.rules] == ["msp", "ebo", "mls", "react", "vim", "knn", "mds"]
        methods.add(name.method)
    assert methods == set(METHOD_NETWORKS) - {"basics", "opengan"}
    energy = next(s for s in trained if s.name == "energy_oe")
    assert energy.params["score_rule"] == "msp"  # eval.sh scored the energy file with msp (test_eval_script.sh)


def test_the_three_zoo_configs_differ_in_the_region_only():
    texts = {r: (CONFIGS / f"species_zoo_{r}.yaml").read_text() for r in REGIONS}
    assert texts["ne-america"].replace("ne-america", "R") == texts["w-europe"].replace("w-europe", "R") == \
        texts["c-america"].replace("c-america", "R")
