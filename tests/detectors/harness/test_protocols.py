"""detectors.harness.protocols: the sweep grids each protocol runs, as the reference's postprocessor YAMLs give them
(OpenOOD's configs/postprocessors/*.yml, Open-Insect's copies where they differ), and `unit_sweep`'s rules."""
import dataclasses

import numpy as np
import pytest

import detectors
from detectors import FeatureSet
from detectors.harness.protocols import DEFAULTS_ONLY, PROTOCOLS, SWEEPS, protocol_params, sweep_space, unit_sweep
from detectors.registry import detector_class

# The one independent statement of the reference grids (postprocessor_sweep; `APS_mode: False` -> no sweep), each
# with the file it is read from: OpenOOD (Jingkang50/OpenOOD at 3c35632) configs/postprocessors/, Open-Insect
# (RolnickLab/Open-Insect at e0aa51e, line numbers as docs/protocols.md cites them) where its copy differs. The
# library reads them from the detector classes (`search_space`, `grids`) into detectors/harness/protocols.py:SWEEPS;
# every other test reads the grids from there.
REFERENCE_GRIDS: dict[str, dict[str, tuple[str, dict]]] = {
    "openood_v1.5": {
        "ash": ("ash.yml:4-7", {"percentile": [65, 70, 75, 80, 85, 90, 95]}),
        "dice": ("dice.yml (APS_mode False)", {}),
        "ebo": ("ebo.yml:4-7", {"temperature": [1]}),
        "fdbd": ("fdbd.yml:4-7", {"distance_as_normalizer": [True, False]}),
        "gen": ("gen.yml", {"gamma": [0.01, 0.1, 0.5, 1, 2, 5, 10], "M": [10, 50, 100, 200, 500, 1000]}),
        "knn": ("knn.yml:4-7 (K_list)", {"k": [50, 100, 200, 500, 1000]}),
        "mcm": ("mcm.yml (APS_mode False)", {}),
        "mds": ("mds.yml (APS_mode False)", {}),
        "mdsens": ("mds_ensemble.yml:4-10", {"noise": [0.0014]}),
        "nci": ("nci.yml", {"alpha": [0.0001, 0.001, 0.01, 0.1]}),
        "odin": ("odin.yml:4-9", {"temperature": [1, 10, 100, 1000], "noise": [0.0014, 0.0028]}),
        "react": ("react.yml", {"percentile": [85, 90, 95, 99]}),
        "she": ("she.yml (APS_mode False)", {}),
    },
    "open-insects": {  # Open-Insect's own copies where they differ from OpenOOD's
        "react": ("react.yml:4-7", {"percentile": [10, 65, 85, 90, 95, 99]}),
        "neco": ("neco.yml:5-9", {"dim": [100, 200, 300, 400]}),
        "rp_ebo": ("rp_ebo.yml:4-7", {"temperature": [1]}),
        "rp_odin": ("rp_odin.yml", {"temperature": [1, 10, 100, 1000], "noise": [0.0014, 0.0028]}),
    },
}


def test_the_grids_are_the_reference_yamls():
    for protocol, table in REFERENCE_GRIDS.items():
        for name, (source, grid) in table.items():
            assert sweep_space(protocol, name, {"declared": [1]}) == grid, (protocol, name, source)


def test_open_insects_is_openood_wherever_its_yamls_are_openoods():
    assert protocol_params("open-insects", "neco") == {"default_dim": 100}  # neco.yml:5-9
    own = set(REFERENCE_GRIDS["open-insects"])
    for name in set(SWEEPS["openood_v1.5"]) - own:
        assert sweep_space("open-insects", name, {}) == sweep_space("openood_v1.5", name, {}), name
    assert set(SWEEPS["open-insects"]) - set(SWEEPS["openood_v1.5"]) <= own  # nothing of its own left unchecked


def test_vim_runs_256_as_the_code_and_exact_refits_the_grid():
    for protocol in PROTOCOLS:
        assert protocol_params(protocol, "vim") == {"default_dim": 256}
    assert sweep_space("openood_v1.5", "vim", {"dim": [256, 1000]}) == {}  # OpenOOD's sweep never refits
    assert sweep_space("exact", "vim", {}) == {"dim": [256, 1000]}
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(4, 300)), rng.normal(size=4)
    train = FeatureSet(rng.normal(size=(400, 300)))
    det = detectors.build("vim", **protocol_params("openood_v1.5", "vim")).fit(train, head=(w, b))
    assert det.effective_params()["dim"] == 256
    small = FeatureSet(rng.normal(size=(100, 40)))  # D <= 256: the rule (the reference's 256 leaves no residual)
    det = detectors.build("vim", default_dim=256).fit(small, head=(w[:, :40], b))
    assert det.effective_params()["dim"] == 20


def test_every_grid_names_real_parameters_and_one_point_grids_are_the_defaults():
    assert set(SWEEPS) == set(PROTOCOLS) >= {"openood_v1.5", "open-insects", "exact"}
    for protocol, table in SWEEPS.items():
        for name, grid in table.items():
            cls = detector_class(name)
            fields = {f.name: f.default for f in dataclasses.fields(cls.Params)}
            assert set(grid) <= set(fields), (protocol, name)
            for key, values in grid.items():
                if len(values) == 1:
                    assert values[0] == fields[key], (protocol, name, key)


def test_a_new_posthoc_detector_sweeps_its_declared_space_under_every_protocol():
    """A post-hoc detector no reference ran (absent from every table) declares its grid once, on the class."""
    new = type("NewDetector", (), {"name": "new_posthoc", "family": "posthoc", "search_space": {"alpha": [0.1, 1.0]}})
    other = type("NewPrompts", (), {"name": "new_prompts", "family": "clip", "search_space": {"alpha": [0.1, 1.0]}})
    for protocol in SWEEPS:
        assert unit_sweep(protocol, new, True) == {"alpha": [0.1, 1.0]}
        assert unit_sweep(protocol, new, True, given=["alpha"]) == unit_sweep(protocol, new, False) == {}
        assert unit_sweep(protocol, other, True) == {}  # other families run their defaults
    for protocol, table in SWEEPS.items():  # every registered post-hoc detector: the protocol's table says what it runs
        assert set(detectors.available("posthoc")) <= set(table) | DEFAULTS_ONLY.get(protocol, frozenset()), protocol


def test_unit_sweep():
    knn, neco = detector_class("knn"), detector_class("neco")
    assert unit_sweep("openood_v1.5", knn, True) == {"k": [50, 100, 200, 500, 1000]}
    assert unit_sweep("openood_v1.5", knn, False) == {}  # no OOD validation: defaults run
    assert unit_sweep("openood_v1.5", knn, True, given=["k"]) == {}  # the config's own value is fixed
    # one point: run, as APS
    assert unit_sweep("openood_v1.5", detector_class("ebo"), True) == SWEEPS["openood_v1.5"]["ebo"]
    assert unit_sweep("openood_v1.5", detector_class("dice"), True) == {}
    assert unit_sweep("open-insects", neco, True) == SWEEPS["open-insects"]["neco"]
    assert unit_sweep("openood_v1.5", neco, True) == {}  # no neco.yml in OpenOOD: its defaults
    assert sweep_space("openood_v1.5", "neco", neco.search_space) == neco.search_space  # what select() sweeps
    assert unit_sweep("openood_v1.5", detector_class("locoop"), True) == {}  # CLIP prompt learners: not in the table
    assert unit_sweep("open-insects", detector_class("oe"), True) == {}  # training-time methods are not swept
    assert unit_sweep("open-insects", detector_class("rp_odin"), True) == SWEEPS["openood_v1.5"]["odin"]
    gen = unit_sweep("openood_v1.5", detector_class("gen"), True, given=["M"])
    assert gen == {"gamma": SWEEPS["openood_v1.5"]["gen"]["gamma"]}


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_unknown_protocol_names_fail(protocol):
    with pytest.raises(KeyError):
        sweep_space(protocol + "-typo", "knn", {})


def test_every_protocol_breaks_ties_as_the_reference_search_and_a_config_can_say_first():
    """TIES: the last maximum under every protocol (Open-Insect's and OpenOOD's OODEvaluator.hyperparam_search);
    `select.ties` is a typed key: `first` accepted (OpenOOD's unified evaluator), anything else one line naming it."""
    from detectors.harness.protocols import TIE_RULES, TIES
    from detectors.harness.runconfig import Select
    from pipelines.errors import ConfigError

    assert set(TIES) == set(PROTOCOLS) and set(TIES.values()) <= set(TIE_RULES)
    assert TIES["open-insects"] == TIES["openood_v1.5"] == "last"
    assert Select.from_dict({"ties": "first"}, "select").ties == "first"
    assert Select.from_dict({}, "select").ties is None  # the protocol's
    with pytest.raises(ConfigError, match=r"select\.ties"):
        Select.from_dict({"ties": "middle"}, "select")


def test_the_plan_takes_the_protocols_tie_rule_unless_the_config_names_one(tmp_path):
    from detectors.harness.plan import make_plan
    from tests.detectors.harness.runner_helpers import id_ood_manifests

    id_dir, ood_dir = id_ood_manifests(tmp_path)
    base = {"id": str(id_dir), "ood": [{"manifest": str(ood_dir), "sets": ["far"]}], "out": str(tmp_path / "out"),
            "detectors": ["msp"], "ood_val": {"manifest": str(ood_dir), "sets": ["near"]},
            "model": "microsoft/resnet-50"}
    assert make_plan({**base, "protocol": "open-insects"}).select.ties == "last"
    assert make_plan({**base, "select": {"ties": "first"}}).select.ties == "first"


def test_checkpoints_per_protocol_and_the_fine_tunes_follow():
    """The reference protocols evaluate and fine-tune with the best ID-val epoch (best.ckpt), exact with the last;
    a training method's own `params.checkpoint` wins, and best without ID val rows is refused in the plan."""
    from detectors.harness.protocols import CHECKPOINTS, LAST_EPOCH_METHODS, OPENOOD_TRAINERS, TRAINING_METHODS
    from pipelines.training.loop import CHECKPOINT_CHOICES

    assert set(CHECKPOINTS) == set(PROTOCOLS) and set(CHECKPOINTS.values()) <= set(CHECKPOINT_CHOICES)
    assert CHECKPOINTS["open-insects"] == CHECKPOINTS["openood_v1.5"] == "best" and CHECKPOINTS["exact"] == "last"
    assert set(LAST_EPOCH_METHODS) <= set(OPENOOD_TRAINERS)
    for name in TRAINING_METHODS + OPENOOD_TRAINERS:
        assert detector_class(name).Params().checkpoint == "last"  # the class default: exact's
        if name in LAST_EPOCH_METHODS:  # no ID-val accuracy to choose by: the last epoch everywhere
            assert all("checkpoint" not in protocol_params(p, name) for p in PROTOCOLS)
            continue
        assert (protocol_params("open-insects", name)["checkpoint"]
                == protocol_params("openood_v1.5", name)["checkpoint"] == "best")
        assert "checkpoint" not in protocol_params("exact", name)


def test_a_best_fine_tune_without_id_val_rows_is_refused_in_the_plan(tmp_path):
    from detectors.harness.plan import make_plan
    from pipelines.data import read_manifest, write_manifest
    from pipelines.errors import ConfigError
    from tests.detectors.harness.runner_helpers import id_ood_manifests

    id_dir, ood_dir = id_ood_manifests(tmp_path)
    manifest = read_manifest(id_dir)
    write_manifest(id_dir, [r for r in manifest.rows if r["split"] != "val"])
    base = {"id": str(id_dir), "ood": [{"manifest": str(ood_dir), "sets": ["far"]}], "out": str(tmp_path / "out"),
            "model": "microsoft/resnet-50", "protocol": "open-insects"}
    with pytest.raises(ConfigError, match=r"detectors\[0\]\.params\.checkpoint: best"):
        make_plan({**base, "detectors": [{"name": "oe", "params": {"mode": "heads"}}]})
    plan = make_plan({**base, "detectors": [{"name": "oe", "params": {"mode": "heads", "checkpoint": "last"}}]})
    assert plan.units[0].params["checkpoint"] == "last"
