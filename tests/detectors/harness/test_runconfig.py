"""The evaluation config as one typed value: every section typed, every fault one line naming the key, detector and
rule parameters checked by the detector's own Params once, the protocol merged into every unit (rules included)."""
import dataclasses

import pytest
import yaml
from runner_helpers import eval_config

from detectors.harness.plan import make_plan
from detectors.harness.runconfig import ConfigError, DetectorSpec, EvalConfig, FewShot, RuleSpec, Select, Transfer
from pipelines.configfile import parse_yaml
from pipelines.params import Config
from pipelines.sources import Source

BASE = {"id": "x", "ood": ["o"], "out": "o"}


@pytest.mark.parametrize("extra, message", [
    ({"families": ["postoc"]}, r"^families\[0\]: must be one of .* got str 'postoc' \(did you mean 'posthoc'\?\)$"),
    ({"detectors": [{"name": "knn", "params": {"K": 10}}]},
     r"^detectors\[0\]\.params\.K: knn: unknown parameter\(s\) \['K'\]"),
    ({"detectors": [{"name": "knn", "param": {"k": 10}}]},
     r"^detectors\[0\]\.param: unknown key \(did you mean 'params'\?\)"),
    ({"detectors": ["msp", "msp"]}, r"method 'msp' appears twice; give one a `label`"),
    ({"detectors": ["msp", {"name": "msp", "rules": ["ebo"]}]}, r"^detectors\[1\]\.rules: only training-time methods"),
    ({"detectors": [{"name": "logitnorm", "rules": ["odin"]}]},
     r"^detectors\[0\]\.rules\[0\]: 'odin' is not a feature-level"),
    ({"detectors": [{"name": "logitnorm", "rules": [{"name": "tempscale", "params": {"fitt": "exact"}}]}]},
     r"^detectors\[0\]\.rules\[0\]\.params\.fitt: tempscale: unknown parameter"),
    ({"detectors": [{"name": "logitnorm", "rules": [{"name": "tempscale", "params": {"fit": "newton"}}]}]},
     r"^detectors\[0\]\.rules\[0\]\.params\.fit: must be one of"),
    ({"detectors": ["logitnorm+msp"]}, r"^detectors\[0\]\.name: unknown detector"),
    ({"select": {"metric": "auroc"}}, r"^select\.ood_val: required without a top-level `ood_val`"),
    ({"select": {"ood_val": {"manifest": "v", "set": ["a"]}}},
     r"^select\.ood_val\.set: unknown key \(did you mean 'sets'\?\)"),
    ({"aux": {"split": "train"}}, r"^aux\.manifest: required"),
    ({"head": {"level": "genus"}}, r"^head\.levels: required"),
    ({"fewshot": {"shot": [1]}}, r"^fewshot\.shot: unknown key \(did you mean 'shots'\?\)"),
    ({"fewshot": {"shots": []}}, r"^fewshot: shots must be a non-empty list"),
    ({"fewshot": {"device": "gpu"}}, r"^fewshot\.device: must be cpu, cuda, cuda:N or auto"),
    ({"plugins": ["no_such_module_xyz"]}, r"^plugins\[0\]: cannot import 'no_such_module_xyz'"),
    ({"detectors": [{"name": "openmax", "params": {"distance": "manhattan"}}]},
     r"^detectors\[0\]\.params\.distance: must be one of 'eucos', 'euclidean', 'cosine'"),
])
def test_malformed_config_one_line(extra, message):
    with pytest.raises(ConfigError, match=message) as caught:
        EvalConfig.from_dict({**BASE, **extra})
    assert "\n" not in str(caught.value)


def test_top_level_errors_name_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping of keys at the top level"):
        EvalConfig.from_yaml(path)
    path.write_text(yaml.safe_dump({**BASE, "ood": "folder"}))
    with pytest.raises(ConfigError, match=r"c.yaml: ood: must be a list .* \(write \[folder\]\)"):
        EvalConfig.from_yaml(path)


def test_sections_are_typed_values_and_round_trip():
    raw = {**BASE, "ood": ["o", {"manifest": "p", "group": "hard", "sets": ["a"]}],
           "detectors": ["msp", {"name": "knn", "params": {"k": 5}, "label": "KNN"},
                         {"name": "logitnorm", "params": {"lr": 1},
                          "rules": ["msp", {"name": "tempscale", "params": {"fit": "exact"}}]}],
           "select": {"ood_val": "v"}, "threshold_transfer": [{"source": "a", "targets": ["b"]}],
           "fewshot": {"shots": [1, 2]}}
    config = EvalConfig.from_dict(raw)
    assert config.ood[0] == Source(manifest="o") and config.ood[1].group == "hard"
    msp, knn, logitnorm = config.detectors
    assert isinstance(msp, DetectorSpec) and msp.params == {} and knn.method == "KNN"
    assert logitnorm.params == {"lr": 1.0} and type(logitnorm.params["lr"]) is float  # converted by its own Params
    assert logitnorm.rules == [RuleSpec(name="msp"), RuleSpec(name="tempscale", params={"fit": "exact"})]
    assert logitnorm.methods() == ["logitnorm", "logitnorm+msp", "logitnorm+tempscale"]
    assert config.select == Select(ood_val=Source(manifest="v"), metric="auroc")
    assert config.threshold_transfer == [Transfer(source="a", targets=["b"], tpr=0.95, positive="ood")]
    assert config.fewshot == FewShot(shots=[1, 2])
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.out = "elsewhere"  # type: ignore[misc]
    # a round trip through YAML is equal, both full and with defaults left out
    assert EvalConfig.from_dict(parse_yaml(yaml.safe_dump(config.to_dict()))) == config
    assert EvalConfig.from_dict(parse_yaml(yaml.safe_dump(config.dump()))) == config
    assert "families" not in config.dump() and "cache_hash" not in config.dump()


@pytest.mark.parametrize("cls", [EvalConfig, DetectorSpec, RuleSpec, Select, Transfer, FewShot])
def test_every_field_documented(cls):
    assert issubclass(cls, Config)
    assert all(cls.doc(name) for name in cls.fields()), [n for n in cls.fields() if not cls.doc(n)]


def test_yaml_numbers_are_numbers(tmp_path):
    """`lr: 1e-3` (YAML 1.1 reads it as a string) is a number; a quoted "1e-3" is a string, refused naming the key."""
    path = tmp_path / "c.yaml"
    path.write_text("id: x\nood: [o]\nout: o\ndetectors:\n  - {name: logitnorm, params: {lr: 1e-3, weight_decay: "
                    "5e-4}}\n")
    spec, = EvalConfig.from_yaml(path).detectors
    assert spec.params == {"lr": 1e-3, "weight_decay": 5e-4}
    with pytest.raises(ConfigError, match=r"detectors\[0\]\.params\.lr: must be a number, got str '1e-3'"):
        EvalConfig.from_yaml(path, ['detectors.logitnorm.params.lr="1e-3"'])


def test_protocol_merged_into_every_unit_rules_included():
    """`protocol: exact` gives TempScale its exact fit, as a detector and as a rule; a unit's own params win."""
    base = {"id": "id", "ood": ["ood"], "out": "out"}
    config = {**base, "detectors": ["tempscale", {"name": "tempscale", "label": "ts_lbfgs", "params": {"fit": "lbfgs"}},
                                    "msp"]}
    default = EvalConfig.from_dict(config)
    assert default.protocol == "openood_v1.5" and [s.params for s in default.detectors] == [{}, {"fit": "lbfgs"}, {}]
    with pytest.raises(ConfigError, match=r"^protocol: must be one of .*\(did you mean 'openood_v1.5'\?\)"):
        EvalConfig.from_dict({**config, "protocol": "openood"})
    # the species default
    assert EvalConfig.from_dict({**config, "protocol": "open-insects"}).protocol == "open-insects"


def test_plan_units_carry_resolved_params(digits, tmp_path):
    """Every unit holds its class and its parameters with the protocol merged in; a tempscale rule under
    `protocol: exact` fits exactly (a rule follows the protocol too)."""
    config = eval_config(digits, tmp_path / "out", protocol="exact",
                         detectors=["tempscale", {"name": "knn", "params": {"k": 3}},
                                    {"name": "logitnorm", "params": {"mode": "heads"},
                                     "rules": ["tempscale", {"name": "tempscale", "params": {"fit": "lbfgs"}}]}])
    with pytest.raises(ConfigError, match=r"method 'logitnorm\+tempscale' appears twice"):
        make_plan(config)  # two rules of one name would write one unit folder
    config["detectors"][2]["rules"] = ["tempscale", "knn"]
    plan = make_plan(config)
    units = {u.method: u for u in plan.units}
    assert units["tempscale"].params == {"fit": "exact"} and units["tempscale"].detector.name == "tempscale"
    assert units["knn"].params == {"k": 3}
    assert units["logitnorm+tempscale"].params == {"fit": "exact"} and units["logitnorm+tempscale"].kind == "rule"
    assert units["logitnorm+tempscale"].parent is units["logitnorm"]
    assert units["logitnorm"].rules == ("logitnorm+tempscale", "logitnorm+knn")
    assert not (tmp_path / "out").exists()


def test_readme_lists_only_keys_the_config_accepts():
    """The README's evaluation config example parses as an EvalConfig mapping: every key it names is accepted."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = text.split("## Evaluation", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    raw = parse_yaml(block)
    assert set(raw) <= set(EvalConfig.fields()), set(raw) - set(EvalConfig.fields())
    assert {"device", "num_workers", "protocol", "cache_hash"} <= set(raw)
    # the example is valid as typed
    EvalConfig.from_dict({**raw, "model": "org/classifier", "head": None, "plugins": []})


@pytest.mark.parametrize("device, ok", [(None, True), ("auto", True), ("cpu", True), ("cuda", True), ("cuda:1", True),
                                        ("mps", False), ("mps:0", False), ("gpu", False), ("cuda:", False),
                                        ("CPU", False), ("cuda:0 ", False)])
def test_device_values_are_the_ones_torch_takes(device, ok):
    import torch

    from pipelines.runtime import runtime_device

    if not ok:
        refused = (r"^device: mps is not supported" if device.startswith("mps")
                   else r"^device: must be cpu, cuda, cuda:N or auto")
        with pytest.raises(ConfigError, match=refused):
            EvalConfig.from_dict({**BASE, "device": device})
        return
    config = EvalConfig.from_dict({**BASE, "device": device})
    resolved = runtime_device(config.device)
    assert resolved is None or torch.device(resolved).type in ("cpu", "cuda")  # torch parses what we accept
