"""The runner's plan step: every malformed config gives one line naming the key and what is allowed, before any work."""
import pytest
import yaml

from detectors.evaluate import Runner
from detectors.runconfig import ConfigError, EvalConfig, detector_specs
from runner_helpers import eval_config

BASE = {"id": "x", "ood": [], "out": "o"}


@pytest.mark.parametrize("extra, message", [
    ({"detectors": "msp"}, r"detectors: .* got the string 'msp' \(write \[msp\]\)"),
    ({"families": "posthoc"}, r"families: a list of names, got the string 'posthoc'"),
    ({"families": ["postoc"]}, r"families: unknown \['postoc'\]; allowed: \['posthoc', 'clip', 'generative', 'training'\]"),
    ({"detectors": [{"name": "knn", "params": {"K": 10}}]}, r"detectors\[0\]\.params: unknown parameter\(s\) \['K'\] for knn"),
    ({"detectors": [{"name": "knn", "param": {"k": 10}}]}, r"detectors\[0\]: unknown key\(s\) \['param'\]"),
    ({"detectors": ["msp", "msp"]}, r"method 'msp' appears twice; give one a `label`"),
    ({"detectors": ["msp", {"name": "msp", "rules": ["ebo"]}]}, r"detectors\[1\]\.rules: only training-time methods"),
    ({"select": {"metric": "auroc"}}, r"select: missing key\(s\) \['ood_val'\]"),
    ({"select": {"ood_val": "v", "metirc": "auroc"}}, r"select: unknown key\(s\) \['metirc'\]; allowed: \['metric', 'ood_val'\]"),
    ({"select": {"ood_val": "v", "metric": "acc"}}, r"select\.metric: 'acc' is not one of"),
    ({"select": {"ood_val": {"manifest": "v", "set": ["a"]}}}, r"select\.ood_val: unknown key\(s\) \['set'\]"),
    ({"aux": {"split": "train"}}, r"aux: missing key\(s\) \['manifest'\]"),
    ({"head": {"level": "genus"}}, r"head: missing key\(s\) \['levels'\]"),
    ({"threshold_transfer": [{"source": "local", "targets": "bci"}]}, r"threshold_transfer\[0\]\.targets: a list of names"),
    ({"threshold_transfer": [{"source": "local", "targets": ["bci"], "tpr": 95}]}, r"threshold_transfer\[0\]\.tpr: a number in \(0, 1\]"),
    ({"fewshot": {"shot": [1]}}, r"fewshot: unknown key\(s\) \['shot'\]"),
    ({"precision": "half"}, r"precision: one of"),
    ({"chunk_rows": 0}, r"chunk_rows: a positive integer, got 0"),
    ({"cache_hash": "md5"}, r"cache_hash: 'md5' is not one of \['stat', 'content'\]"),
    ({"plugins": ["no_such_module_xyz"]}, r"plugins: cannot import 'no_such_module_xyz'"),
    ({"detectors": [{"name": "openmax", "params": {"distance": "manhattan"}}]}, r"detectors\[0\]\.params\.distance: openmax: distance must be one of"),
])
def test_malformed_config_one_line(extra, message):
    with pytest.raises(ConfigError, match=message) as caught:
        Runner(EvalConfig.from_dict({**BASE, **extra}))
    assert "\n" not in str(caught.value)


def test_top_level_errors(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping at the top level"):
        EvalConfig.from_yaml(path)
    path.write_text(yaml.safe_dump({**BASE, "ood": "folder"}))
    with pytest.raises(ConfigError, match="'ood' must be a list"):
        EvalConfig.from_yaml(path)


def test_data_checks_in_the_plan(digits, tmp_path):
    """Duplicate OOD set names, unknown sets, transfer names and ID rows in aux are refused before any model loads."""
    id_dir, ood_dir, _ = digits
    cases = [
        ({"ood": [{"manifest": str(ood_dir)}, {"manifest": str(ood_dir), "sets": ["texture"]}]},
         r"ood\[1\]: OOD set 'texture' is also given by ood\[0\]"),
        ({"ood": [{"manifest": str(ood_dir), "sets": ["textures"]}]}, r"ood\[0\]: OOD set 'textures' has no rows"),
        ({"threshold_transfer": [{"source": "digits", "targets": ["sketch"]}]},
         r"threshold_transfer\[0\]\.source: 'digits' is not an evaluated OOD set"),
        ({"aux": {"manifest": str(id_dir), "split": "train"}}, r"aux: .* holds \d+ ID rows \(role id\)"),
    ]
    for extra, message in cases:
        with pytest.raises(ConfigError, match=message):
            Runner(EvalConfig.from_dict(eval_config(digits, tmp_path / "x", detectors=["msp"], **extra)))
    assert not (tmp_path / "x").exists()


def test_protocol_sets_reference_defaults_and_is_checked():
    base = {"id": "id", "ood": ["ood"], "out": "out", "detectors": ["tempscale", {"name": "tempscale", "label": "ts_lbfgs",
                                                                              "params": {"fit": "lbfgs"}}, "msp"]}
    default = detector_specs(EvalConfig.from_dict(base))
    assert EvalConfig.from_dict(base).protocol == "openood_v1.5" and [s.params for s in default] == [{}, {"fit": "lbfgs"}, {}]
    exact = detector_specs(EvalConfig.from_dict({**base, "protocol": "exact"}))
    assert [s.params for s in exact] == [{"fit": "exact"}, {"fit": "lbfgs"}, {}]  # a detector's own params win
    with pytest.raises(ConfigError, match="protocol: 'openood' is not one of"):
        EvalConfig.from_dict({**base, "protocol": "openood"}).validate()
