"""Which rank runs which unit (detectors.harness.distribute): from the plan alone, balanced, rules beside their
training unit, training and sharded fits together."""
from __future__ import annotations

from types import SimpleNamespace

from detectors.harness.distribute import EVERY, assign, collective, unit_cost


def _cls(family="posthoc", shards=False, trains=False, inputs=("logits",)):
    return SimpleNamespace(family=family, fits_from_shards=shards, trains_across_processes=trains,
                           inputs=frozenset(inputs))


def _unit(method, cls=None, kind="detector", parent=None, sweep=None):
    return SimpleNamespace(method=method, kind=kind, detector=cls or _cls(), parent=parent,
                           parts={"sweep": sweep} if sweep else {})


def test_units_are_dealt_largest_first_to_the_least_loaded_rank():
    units = [_unit("msp"), _unit("knn"), _unit("diffguard", _cls("generative")), _unit("ebo"), _unit("mls")]
    where = assign(units, {u.method for u in units}, 2, train_rows=100)
    assert where == {"diffguard": 0, "msp": 1, "knn": 1, "ebo": 1, "mls": 1}
    assert assign(units, {"msp", "knn", "ebo", "mls"}, 2, 100) == {"msp": 0, "knn": 1, "ebo": 0, "mls": 1}
    assert assign(units, {u.method for u in units}, 1, 100) == {u.method: 0 for u in units}
    assert assign(units, set(), 2, 100) == {}  # every unit finished: nothing to run


def test_training_and_its_rules_run_together_and_shards_from_the_row_limit():
    oe = _unit("oe", _cls("training", trains=True))
    rule = _unit("oe+msp", kind="rule", parent=oe)
    mds = _unit("mds", _cls(shards=True))
    units = [oe, rule, mds, _unit("msp")]
    pending = {u.method for u in units}
    assert assign(units, pending, 2, train_rows=10, shard_fit_rows=100) == {"oe": EVERY, "oe+msp": EVERY, "mds": 0,
                                                                            "msp": 1}
    assert assign(units, pending, 2, train_rows=100, shard_fit_rows=100)["mds"] == EVERY
    assert collective(_unit("fewshot", kind="fewshot"), 0)
    assert not collective(mds, 99, 100)


def test_a_rule_goes_where_its_solo_parent_goes():
    gan = _unit("opengan", _cls("generative"))
    units = [_unit("msp"), gan, _unit("opengan+msp", kind="rule", parent=gan)]
    where = assign(units, {u.method for u in units}, 2, 10)
    assert where["opengan"] == where["opengan+msp"] != where["msp"]


def test_a_sweep_costs_its_grid_points():
    assert unit_cost(_unit("knn", kind="select", sweep={"k": [1, 10, 50], "x": [0, 1]})) == 6
    assert unit_cost(_unit("diffguard", _cls("generative"))) > unit_cost(_unit("msp"))
    assert unit_cost(_unit("odin", _cls(inputs=("images",)))) == 10 * unit_cost(_unit("msp"))
