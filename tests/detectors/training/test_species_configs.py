"""The shipped Open-Insects region configs: one base (species_base.yaml, the paper's methods and the protocol) and a
short file per region; they load with the runner's config reader, list the paper's methods (Table 2 post-hoc, Table 7
training rows), every training method builds in full mode, a fourth region is a 10-line file, and per-method settings
are overridden from the command line by name."""
from pathlib import Path

import pytest
from helpers.models import stub_weights

from detectors.harness.evaluate import EvalConfig
from detectors.registry import detector_class
from pipelines.configfile import load_yaml
from pipelines.sources import Source

CONFIGS = Path(__file__).parents[3] / "configs"
TABLE2 = ["openmax", "msp", "tempscale", "odin", "mds", "mdsens", "rmds", "gram", "ebo", "opengan", "gradnorm", "react",
          "mls", "klm", "vim", "knn", "dice", "rankfeat", "ash", "she", "neco", "fdbd", "rp_msp", "rp_odin", "rp_ebo",
          "rp_gradnorm"]
TABLE7 = ["confbranch", "logitnorm", "arpl", "godin", "rotpred", "oe", "mcd", "mixoe", "energy_oe", "udg",
          "novel_branch", "extended"]
RULES = ["msp", "ebo", "mls", "react", "vim", "knn", "mds"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """A local model folder with a (valid, tiny) weight file, standing in for the region's classifier (`model` is
    checked at load: a weight file that is not safetensors is refused)."""
    folder = tmp_path_factory.mktemp("classifier")
    stub_weights(folder / "model.safetensors")
    return str(folder)


@pytest.mark.parametrize("region", ["ne-america", "w-europe", "c-america"])
def test_region_config_lists_the_papers_methods_in_full_mode(region, model):
    config = EvalConfig.from_yaml(CONFIGS / f"species_{region}.yaml", [f"model={model}"])
    assert config.id == f"splits/{region}" and config.protocol == "open-insects"
    assert config.aux == Source(manifest=f"splits/{region}", split="train")
    assert config.ood_val == Source(manifest=f"splits/{region}", split="val", sets=["auxiliary"])
    assert config.ood == [Source(manifest=f"splits/{region}")] and config.ood[0].read_split("test") == "test"
    specs = config.detectors
    assert [s.name for s in specs] == TABLE2 + TABLE7
    for spec in specs:
        cls = detector_class(spec.name)
        if cls.family == "training":
            det = cls(**spec.params)  # the recipe defaults construct
            assert det.params["mode"] == "full" and det.inputs == frozenset({"images"})
            assert det.params["epochs"] == 30 and det.params["lr"] == 1e-3 and det.params["warmup_epochs"] == 2
            assert det.params["batch_size"] == (256 if spec.name == "rotpred" else 512)
            assert [r.name for r in spec.rules] == RULES
    assert bool(config.threshold_transfer) == bool(config.field) == (region == "c-america")  # BCI is in Panama


def test_region_files_are_short_and_the_base_holds_the_methods():
    for region in ("ne-america", "w-europe", "c-america"):
        lines = [l for l in (CONFIGS / f"species_{region}.yaml").read_text().splitlines() if l
                 and not l.startswith("#")]
        assert lines[0] == "base: species_base.yaml" and len(lines) <= 10
    assert "detectors" in load_yaml(CONFIGS / "species_base.yaml")


def test_a_fourth_region_is_a_ten_line_file(tmp_path, model):
    path = tmp_path / "species_s-america.yaml"
    path.write_text(f"base: {CONFIGS / 'species_base.yaml'}\n"
                    f"model: {model}\n"
                    "id: splits/s-america\n"
                    "ood: [{manifest: splits/s-america}]\n"
                    "aux: {manifest: splits/s-america}\n"
                    "ood_val: {manifest: splits/s-america}\n"
                    "out: runs/species_s_america\n")
    assert len(path.read_text().splitlines()) <= 10
    config = EvalConfig.from_yaml(path)
    assert [s.name for s in config.detectors] == TABLE2 + TABLE7
    assert config.ood_val == Source(manifest="splits/s-america", split="val", sets=["auxiliary"])
    assert config.protocol == "open-insects" and config.out == "runs/species_s_america"


def test_per_method_overrides_by_name(model):
    config = EvalConfig.from_yaml(CONFIGS / "species_w-europe.yaml",
                                  [f"model={model}", "detectors.novel_branch.params.epochs=2",
                                   "detectors.knn.params.k=10", "detectors.logitnorm.params.lr=1e-4"])
    specs = {s.name: s for s in config.detectors}
    assert specs["novel_branch"].params == {"epochs": 2} and specs["novel_branch"].rules[0].name == "msp"
    assert specs["knn"].params == {"k": 10} and specs["logitnorm"].params == {"lr": 1e-4}
    assert specs["udg"].params == {}  # the others untouched


def test_a_typo_in_the_model_path_is_one_line():
    from pipelines.errors import ConfigError

    with pytest.raises(ConfigError, match=r"species_w-europe.yaml: model: the local model folder 'runs/own/clasifier' "
                                          r"does not exist$") as caught:
        EvalConfig.from_yaml(CONFIGS / "species_w-europe.yaml", ["model=runs/own/clasifier"])
    assert "huggingface" not in str(caught.value) and "\n" not in str(caught.value)  # a local path: no hub advice


def test_short_species_config_builds(model):
    config = EvalConfig.from_yaml(CONFIGS / "eval_species.yaml", [f"model={model}"])
    assert config.ood_val.sets == ["auxiliary"]
    modes = {s.name: detector_class(s.name)(**s.params).params.get("mode") for s in config.detectors}
    assert modes["novel_branch"] == "full" and modes["logitnorm"] == "heads"
