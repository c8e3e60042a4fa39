"""pipelines.cli: input errors as one line with exit status 2 (a misspelt key, a YAML error naming file and line, a
manifest fault naming its README section), `--debug` tracebacks, overrides, list and pair parsing, quiet warnings."""
import warnings

import pytest
import yaml

from pipelines import cli, configfile
from pipelines.errors import ConfigError
from pipelines.params import Config, config, param
from pipelines.schema import ManifestError


def run(main, argv, capsys, doc=None):
    status = cli.run_main(main, argv, doc=doc)
    captured = capsys.readouterr()
    return status, captured.err


@config
class RunConfig(Config):
    DOC = cli.README_SECTIONS["config"]

    model: str = param("m", "the model")
    detectors: str = param("all", "the detectors")


def test_misspelt_key_is_one_line_with_the_closest_key_and_the_doc(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text("model: m\ndetecters: all\n")
    status, err = run(lambda argv: RunConfig.from_yaml("run.yaml"), [], capsys)
    assert status == 2
    assert err == ("error: run.yaml: detecters: unknown key (did you mean 'detectors'?) "
                   "(see README.md, section 'Evaluation')\n")


def test_yaml_error_names_file_and_line_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("model: m\ndetectors: [msp, knn\nout: x\n")

    def main(argv):
        args = cli.parser("t", config=True, overrides=True).parse_args(argv)
        configfile.load_yaml(args.config, args.overrides)

    status, err = run(main, ["--config", "bad.yaml"], capsys, doc="docs/x.md")
    assert status == 2 and err.count("\n") == 1
    assert err.startswith("error: bad.yaml: not valid YAML (") and "line 3" in err and err.endswith("(see docs/x.md)\n")


def test_yaml_error_raised_outside_load_yaml_is_one_line_too(tmp_path, capsys):
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text("a: [1\n")

    def main(argv):
        with open(path) as fh:
            yaml.safe_load(fh)

    status, err = run(main, [], capsys)
    assert status == 2 and err.count("\n") == 1 and "c.yaml: not valid YAML" in err and "line 2" in err


def test_manifest_error_names_its_readme_section(capsys):
    def main(argv):
        raise ManifestError("m/metadata.jsonl", 4, "split", "must be one of ('train', 'val', 'test'), got 'dev'")

    status, err = run(main, [], capsys, doc="docs/other.md")
    assert status == 2
    assert err == ("error: m/metadata.jsonl, line 4, field 'split': must be one of ('train', 'val', 'test'), got "
                   "'dev' (see README.md, section 'Data formats')\n")


def test_debug_shows_the_traceback_and_bugs_keep_theirs(capsys):
    def main(argv):
        raise ConfigError("bad key")

    status, err = run(main, ["--debug"], capsys)
    assert status == 2 and "Traceback (most recent call last)" in err and "ConfigError: bad key" in err

    def buggy(argv):
        raise ZeroDivisionError("bug")

    with pytest.raises(ZeroDivisionError):
        cli.run_main(buggy, [])


def test_success_status_and_messages_never_point_outside_the_repository():
    assert cli.run_main(lambda argv: None, []) == 0
    assert cli.run_main(lambda argv: 3, []) == 3
    assert all("DESIGN.md" not in doc and not doc.startswith(("/", "..")) for doc in cli.README_SECTIONS.values())


def test_overrides_parse_yaml_values_and_reach_nested_keys():
    raw = {"model": "m", "runtime": {"batch_size": 8}, "ood": [1]}
    out = configfile.apply_overrides(raw, ["runtime.batch_size=64", "detectors=[msp, knn]", "new.deep.key=true",
                                           "out=x=y"])
    assert out == {"model": "m", "runtime": {"batch_size": 64}, "ood": [1], "detectors": ["msp", "knn"],
                   "new": {"deep": {"key": True}}, "out": "x=y"}
    assert raw["runtime"] == {"batch_size": 8}  # the input is not changed
    with pytest.raises(ConfigError, match="override ood.x: no item named 'x'"):
        configfile.apply_overrides(raw, ["ood.x=1"])
    with pytest.raises(ConfigError, match="override model.x: 'model' is str 'm' in the config, not a mapping"):
        configfile.apply_overrides(raw, ["model.x=1"])
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        configfile.apply_overrides(raw, ["batch_size"])
    with pytest.raises(ConfigError, match="not valid YAML"):
        configfile.apply_overrides(raw, ["a=[1"])


def test_load_yaml_missing_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        configfile.load_yaml(tmp_path / "none.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        configfile.load_yaml(tmp_path / "list.yaml")
    (tmp_path / "ok.yaml").write_text("a: 1\n")
    assert configfile.load_yaml(tmp_path / "ok.yaml", ["b=2"]) == {"a": 1, "b": 2}


def test_overrides_reach_list_items_by_name_label_or_index():
    raw = {"detectors": ["msp", {"name": "knn", "params": {"k": 3}}, {"name": "knn", "label": "knn2"}]}
    out = configfile.apply_overrides(raw, ["detectors.msp.params.temperature=2", "detectors.knn.params.k=7",
                                    "detectors.knn2.params.k=9", "detectors.-1.label=knn3", "lr=1e-5"])
    assert out["detectors"] == [{"name": "msp", "params": {"temperature": 2}}, {"name": "knn", "params": {"k": 7}},
                                {"name": "knn", "label": "knn3", "params": {"k": 9}}]
    assert out["lr"] == 1e-5 and isinstance(out["lr"], float)  # YAML 1.2 numbers
    with pytest.raises(ConfigError, match=r"no item named 'kn' in the list \(did you mean 'knn'\?\)"):
        configfile.apply_overrides(raw, ["detectors.kn.params.k=1"])
    with pytest.raises(ConfigError, match="index 5 is outside the list of 3 items"):
        configfile.apply_overrides(raw, ["detectors.5.params.k=1"])


def test_base_configs_merge_mappings_and_replace_lists(tmp_path):
    (tmp_path / "base.yaml").write_text("out: runs/x\nselect: {metric: auroc, ood_val: v}\ndetectors: [msp, knn]\n")
    (tmp_path / "region.yaml").write_text("base: base.yaml\nid: data/id\nselect: {metric: fpr95}\ndetectors: [vim]\n")
    assert configfile.load_yaml(tmp_path / "region.yaml", ["detectors.vim.params.dim=8"]) == {
        "out": "runs/x", "select": {"metric": "fpr95", "ood_val": "v"}, "id": "data/id",
        "detectors": [{"name": "vim", "params": {"dim": 8}}]}
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        configfile.load_yaml(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("base: missing.yaml\n")
    with pytest.raises(ConfigError, match=r"missing.yaml: no such config file \(the base of"):
        configfile.load_yaml(tmp_path / "c.yaml")


def test_yaml_numbers_are_yaml_1_2():
    assert configfile.parse_yaml("a: 1e-5\nb: 1E3\nc: '1e-5'\nd: 1.5\ne: 7\nf: .inf") == {
        "a": 1e-5, "b": 1000.0, "c": "1e-5", "d": 1.5, "e": 7, "f": float("inf")}
    with pytest.raises(yaml.YAMLError):
        configfile.parse_yaml("a: !!python/object/apply:os.system ['true']")


def test_list_and_pair_parsers():
    assert cli.comma_list(" a, b,,c ") == ["a", "b", "c"]
    assert cli.comma_list(["x", " y "]) == ["x", "y"]
    assert cli.comma_list("") is None and cli.comma_list(None) is None
    assert cli.pairs(["near=/d/near", "far = /d/far"], "--ood") == {"near": "/d/near", "far": "/d/far"}
    with pytest.raises(ConfigError, match="--ood: 'a' is given twice"):
        cli.pairs(["a=1", "a=2"], "--ood")
    with pytest.raises(ConfigError, match="--ood takes NAME=VALUE, got '=x'"):
        configfile.pair("=x", "--ood")


def test_quiet_warnings_hide_library_chatter_and_keep_ours():
    with warnings.catch_warnings(record=True) as seen:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        cli.quiet_warnings()
        warnings.warn_explicit("old api", FutureWarning, "x.py", 1, module="transformers.utils")
        warnings.warn_explicit("old api", DeprecationWarning, "x.py", 1, module="diffusers.models")
        warnings.warn_explicit("The `local_dir_use_symlinks` argument is deprecated and ignored", UserWarning,
                               "v.py", 2, module="huggingface_hub.utils._validators")
        warnings.warn_explicit("klm: 3 classes are never predicted", UserWarning, "klm.py", 5,
                               module="detectors.posthoc.klm")
    messages = [str(w.message) for w in seen]
    assert messages == ["klm: 3 classes are never predicted"]


def test_known_library_log_records_are_dropped_and_others_kept(monkeypatch):
    import logging

    monkeypatch.setenv("OODFORGE_PROGRESS", "bar")  # leave the libraries' bars alone here
    cli.quiet_warnings()
    cli.quiet_warnings()  # idempotent: one filter
    logger = logging.getLogger("transformers.utils.import_utils")
    assert sum(isinstance(f, cli._DropMessages) for f in logger.filters) == 1
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # on the logger itself: transformers may stop propagation to the root's caplog
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "level", logging.WARNING)
    try:
        logger.warning("`ViTImageProcessor` requires torchvision (not installed); falling back to "
                       "`ViTImageProcessorPil`")
        logger.warning("Some weights of ResNetForImageClassification were not initialized")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == ["Some weights of ResNetForImageClassification were not initialized"]


def test_library_bars_are_turned_off_in_logs(monkeypatch):
    monkeypatch.setenv("OODFORGE_PROGRESS", "lines")
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    cli.quiet_warnings()
    import os

    from huggingface_hub.utils import are_progress_bars_disabled

    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1" and are_progress_bars_disabled()
