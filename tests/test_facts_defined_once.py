"""Each fact is defined once: the source tree is scanned with `ast`, and a second definition of the
detector families, the OOD groups, the metric names, softmax / logsumexp, the file-name sanitiser, the
`class_names.json` schema, a training hyperparameter's default, a `score_rules` tuple or a restated base-class default
fails here, naming the file and line."""
from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest

import detectors
from detectors.harness.results import METRICS
from detectors.registry import FAMILIES
from pipelines.class_names import CLASS_NAMES as CLASS_NAMES_FILE
from pipelines.schema import GROUPS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipelines", "detectors", "gen", "oodforge", "scripts")
SANITISER_KNOWN = {
    # a second sanitiser the lead should fold into pipelines.io.safe_name at merge (owner's file, not touched here)
    "gen/pairing.py": "genconfig's file: a pair's file-name stem",
    # not a file name: an HTML anchor id (lower case, hyphens), which safe_name's characters would not give
    "detectors/harness/report/html.py": "an HTML anchor slug",
}


def _sources() -> list[tuple[str, ast.Module]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found.append((path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))))
    return found


SOURCES = _sources()


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (module, class, function) or bare string statements."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)}


def _string_collections(tree: ast.Module):
    """(line, set of strings) of every tuple / list / set literal of string constants, and of every dict's keys."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        strings = {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        if strings:
            yield node.lineno, strings


def _where(fact: set[str], exact: bool = False) -> list[str]:
    return [f"{name}:{line}" for name, tree in SOURCES for line, strings in _string_collections(tree)
            if (strings == fact if exact else fact <= strings)]


@pytest.mark.parametrize("fact, home, exact", [
    (set(FAMILIES), "detectors/registry.py", True),
    (set(GROUPS), "pipelines/schema.py", False),
    (set(METRICS), "detectors/harness/results.py", False),
], ids=["families", "groups", "metrics"])
def test_one_literal_list(fact, home, exact):
    found = [f for f in _where(fact, exact) if not f.startswith(COMPUTED.get(tuple(sorted(fact)), "-"))]
    assert found and all(f.startswith(home + ":") for f in found), found


COMPUTED = {tuple(sorted(METRICS)): "detectors/metrics.py:"}
"""Where a fact's values are computed rather than listed: `detectors.metrics.evaluate` returns each metric by name."""


def test_the_computed_metrics_are_the_listed_ones():
    from detectors.metrics import evaluate

    assert tuple(evaluate([0.0, 1.0, 2.0], [0.5, -1.0])) == METRICS


def test_softmax_and_logsumexp_once():
    pattern = re.compile(r"^_?(log_?)?(softmax|logsumexp)\d*$")
    defined = [f"{name}:{node.lineno} {node.name}" for name, tree in SOURCES for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef) and pattern.match(node.name)]
    assert sorted(d.split(" ")[1] for d in defined) == ["log_softmax", "logsumexp", "softmax"], defined
    assert all(d.startswith("detectors/posthoc/common.py:") for d in defined), defined


def _sanitisers(tree: ast.Module) -> list[int]:
    """Lines of a character-by-character name cleaner (`c if c.isalnum() else ...`) or a negated character-class
    substitution (`re.sub(r"[^a-z0-9]+", ...)`)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.IfExp) and any(isinstance(n, ast.Attribute) and n.attr == "isalnum"
                                               for n in ast.walk(node.test)):
            lines.append(node.lineno)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sub"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and re.search(r"\[\^[^\]]*(a-z|A-Z|0-9|\\w)", node.args[0].value)):
            lines.append(node.lineno)
    return lines


def test_one_file_name_sanitiser():
    found = {name: _sanitisers(tree) for name, tree in SOURCES}
    found = {name: lines for name, lines in found.items() if lines}
    assert set(found) - set(SANITISER_KNOWN) == {"pipelines/io.py"} and len(found["pipelines/io.py"]) == 1, found


def test_class_names_json_schema_once():
    """The file name appears as a value in one module (docstrings aside), and only class_names.py spells its keys."""
    named = [f"{name}:{node.lineno}" for name, tree in SOURCES for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value == CLASS_NAMES_FILE and id(node) not in _docstrings(tree)]
    assert [n.split(":")[0] for n in named] == ["pipelines/class_names.py"], named
    schema = _where({"names", "label_field", "levels"})
    assert all(s.startswith("pipelines/class_names.py:") for s in schema) and schema, schema


def test_a_second_definition_is_found(tmp_path):
    """The scan finds what it looks for: a planted second softmax, family list and sanitiser are each seen."""
    planted = ast.parse('FAMILIES = ("posthoc", "clip", "generative", "training")\n'
                        "def softmax(x):\n    return x\n"
                        "slug = ''.join(c if c.isalnum() else '-' for c in name)\n")
    assert [line for line, s in _string_collections(planted) if s == set(FAMILIES)] == [1]
    assert [n.name for n in ast.walk(planted) if isinstance(n, ast.FunctionDef)] == ["softmax"]
    assert _sanitisers(planted) == [4]


# -- training hyperparameters, Literal choices, inherited declarations -----------------------------------------------
HYPERPARAMETERS = ("epochs", "lr", "batch_size", "weight_decay", "warmup_epochs")
"""Training hyperparameters with one home: `pipelines.training.settings.TrainSettings` (its defaults)."""
TRAINING_PACKAGES = ("pipelines/training/", "detectors/training/")
HYPERPARAMETER_KNOWN = {
    "pipelines/training/settings.py": {"epochs", "lr", "batch_size", "weight_decay", "warmup_epochs"},  # the home
    "detectors/training/rotpred.py": {"batch_size"},  # a method's own published value (Open-Insects' RotPred: 256)
}


def _literal_default(value: ast.expr | None) -> bool:
    """A default written out: a constant other than None, or `param(<constant>, ...)`."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "param" and value.args:
        value = value.args[0]
    return isinstance(value, (ast.Constant, ast.UnaryOp)) and getattr(value, "value", 0) is not None


def _hyperparameter_defaults(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of every default given to a training hyperparameter: a function's keyword default, or a class
    field's value (`batch_size: int = param(512, ...)`, `lr = 1e-3`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            positional = (a.posonlyargs + a.args)[len(a.posonlyargs + a.args) - len(a.defaults):]
            pairs = [*zip(positional, a.defaults), *zip(a.kwonlyargs, a.kw_defaults)]
            found += [(node.lineno, arg.arg) for arg, d in pairs if arg.arg in HYPERPARAMETERS and d is not None
                      and _literal_default(d)]
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                target = stmt.target if isinstance(stmt, ast.AnnAssign) else (
                    stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None)
                if isinstance(target, ast.Name) and target.id in HYPERPARAMETERS and _literal_default(stmt.value):
                    found.append((stmt.lineno, target.id))
    return found


def test_one_home_per_training_hyperparameter_default():
    """A second `batch_size` (or epochs, lr, ...) default in the training code fails here: TrainSettings holds them,
    recipes and protocols change them by name (`RECIPES`, `TRAINING_PROTOCOLS`, `detectors.harness.protocols`)."""
    found = {name: {n for _, n in _hyperparameter_defaults(tree)} for name, tree in SOURCES
             if name.startswith(TRAINING_PACKAGES)}
    found = {name: names for name, names in found.items() if names}
    assert found == HYPERPARAMETER_KNOWN, found


def _literal_restated(tree: ast.Module) -> list[int]:
    """Lines of a class-body `score_rules = (...)` / `modes = (...)` tuple written out: both derive from the Literal of
    the class's `Params.score_rule` / `Params.mode` (`Params.choices`)."""
    return [stmt.lineno for node in ast.walk(tree) if isinstance(node, ast.ClassDef) for stmt in node.body
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None
            and any(isinstance(t, ast.Name) and t.id in ("score_rules", "modes")
                    for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]))]


def test_score_rules_derive_from_the_literal():
    found = [f"{name}:{line}" for name, tree in SOURCES for line in _literal_restated(tree)]
    assert not found, found
    for name in detectors.available("training"):
        cls = detectors.detector_class(name)
        assert cls.score_rules == typing.get_args(cls.Params.hints()["score_rule"]), name
        assert cls.modes == typing.get_args(cls.Params.hints()["mode"]), name


def _detector_classes() -> list[type]:
    from detectors.base import Detector

    detectors.available()  # every family module imported
    found, todo = [], [Detector]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.split(".")[0] == "detectors" and sub not in found:
                found.append(sub)
                todo.append(sub)
    return found


def _assigned(tree: ast.Module, qualname: str) -> set[str]:
    """Names the body of the top-level class `qualname` assigns (nested classes, such as `Params`, included)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == qualname:
            names = set()
            for stmt in node.body:
                if isinstance(stmt, ast.Assign):
                    names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
                elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name):
                    names.add(stmt.target.id)
                elif isinstance(stmt, ast.ClassDef):
                    names.add(stmt.name)
            return names
    return set()


_NOT_INHERITED = object()


def _default(field: typing.Any) -> typing.Any:
    """A dataclass field's default, a list or dict default made by its factory."""
    if field.default is not dataclasses.MISSING or field.default_factory is dataclasses.MISSING:
        return field.default
    return field.default_factory()


def _restated(cls: type, names: set[str]) -> list[str]:
    """Which of the class attributes `names` (assigned in `cls`'s body) equal what `cls` inherits, and which of its
    `Params` fields (declared in its own Params) equal the inherited Params' field (type, default, doc, range)."""
    out = []
    for name in sorted(names - {"Params", "name", "defaults"}):
        inherited = next((vars(k)[name] for k in cls.__mro__[1:] if name in vars(k)), _NOT_INHERITED)
        if inherited is not _NOT_INHERITED and not callable(inherited) and vars(cls).get(name) == inherited:
            out.append(name)
    params, parent = vars(cls).get("Params"), getattr(cls.__mro__[1], "Params", None)
    if "Params" in names and params is not None and parent is not None and params is not parent:
        own, inherited = params.fields(), parent.fields()
        for field in params.__dict__.get("__annotations__", {}):
            if field in inherited and params.hints()[field] == parent.hints()[field] \
                    and _default(own[field]) == _default(inherited[field]) \
                    and dict(own[field].metadata) == dict(inherited[field].metadata):
                out.append(f"Params.{field}")
    return out


def test_no_restated_base_class_default():
    """A detector class that writes out what it inherits (`needs = frozenset()`, the base's `score_rule` field) fails
    here: the base class states the default once."""
    trees = dict(SOURCES)
    found = {}
    for cls in _detector_classes():
        module = cls.__module__.replace(".", "/") + ".py"
        restated = _restated(cls, _assigned(trees[module], cls.__qualname__))
        if restated:
            found[f"{module}:{cls.__qualname__}"] = restated
    assert not found, found


def test_the_training_and_declaration_scans_find_a_planted_restatement():
    """A planted second batch_size default, a hand-written score_rules tuple and a restated `needs` are each seen."""
    MSP, OE = detectors.detector_class("msp"), detectors.detector_class("oe")
    planted = ast.parse("def finetune(x, *, batch_size=64, lr=None):\n    pass\n"
                        "class P:\n    batch_size: int = param(256, 'doc')\n    epochs = optional('epochs')\n"
                        "class D:\n    score_rules = ('msp', 'energy')\n")
    assert _hyperparameter_defaults(planted) == [(1, "batch_size"), (4, "batch_size")]
    assert _literal_restated(planted) == [7]
    restating = type("Restating", (MSP,), {"needs": frozenset(), "paper": "another paper"})
    assert _restated(restating, {"needs", "paper"}) == ["needs"]
    same_rule = dataclasses.make_dataclass("Params", [("score_rule", OE.Params.hints()["score_rule"],
                                                       OE.Params.fields()["score_rule"])],
                                           bases=(OE.Params,), frozen=True)
    assert _restated(type("SameRule", (OE,), {"Params": same_rule}), {"Params"}) == ["Params.score_rule"]


def test_params_imported_from_their_home():
    """`Params` / `param` have one import home, `pipelines.params` (the defining module): `detectors.base` does not
    re-export them, and no module imports them from elsewhere; `detectors` keeps them among its public names."""
    import detectors.base
    import pipelines.params

    found = [f"{name}:{node.lineno}" for name, tree in SOURCES for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("detectors")
             and {a.name for a in node.names} & {"Params", "param"}]
    assert not found, found
    assert not hasattr(detectors.base, "Params") and not hasattr(detectors.base, "param")
    assert (detectors.Params, detectors.param) == (pipelines.params.Params, pipelines.params.param)


OWN_LOOP_SETTINGS = ("epochs", "lr", "weight_decay", "warmup_epochs")
"""Training hyperparameters a method with its own loop (CLIP prompt learning, OpenGAN) takes from `TrainSettings`."""


def test_own_training_loops_take_their_settings_from_train_settings():
    """A detector that trains with its own loop declares epochs / lr / weight decay with `setting` (type, bounds and
    doc from `TrainSettings`) and takes their defaults from its reference `Params.training`; `TrainSettings.read`
    gives them back, a user's value (under the method's own key) winning."""
    from pipelines.training.settings import TrainSettings

    found = []
    for name in detectors.available():
        params = detectors.detector_class(name).Params
        own = set(OWN_LOOP_SETTINGS) & set(params.fields())
        if not own or issubclass(params, TrainSettings):
            continue
        found.append(name)
        for key, field in params.fields().items():
            if "setting" in field.metadata:
                assert params.defaults()[key] == getattr(params.training, field.metadata["setting"]), (name, key)
        assert all("setting" in params.fields()[key].metadata for key in own), (name, own)
    assert sorted(found) == ["clipn", "idlike", "lapt", "locoop", "opengan"], found
    locoop = detectors.detector_class("locoop").Params
    read = TrainSettings.read(locoop, {**locoop.defaults(), "train_batch": 8, "lr": 0.5})
    assert (read.batch_size, read.lr, read.epochs, read.weight_decay, read.warmup_epochs) == (8, 0.5, 50, 5e-4, 1)
