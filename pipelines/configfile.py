"""Config files: YAML read as YAML 1.2 reads numbers (`parse_yaml`), a file's `base:` chain merged in (`load_yaml`)
and `key=value` overrides applied (`apply_overrides`); every fault is one ConfigError naming the file or override.
`pipelines.params.Config.from_yaml` reads every command's config through these."""
from __future__ import annotations

import copy
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from pipelines.errors import ConfigError, closest


def pair(value: str, flag: str = "argument", sep: str = "=") -> tuple[str, str]:
    """'NAME=VALUE' -> ('NAME', 'VALUE'); anything else raises ConfigError naming the flag."""
    name, found, rest = value.partition(sep)
    if not found or not name.strip() or not rest.strip():
        raise ConfigError(f"{flag} takes NAME{sep}VALUE, got {value!r}")
    return name.strip(), rest.strip()


class ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader reading numbers as YAML 1.2 does: `1e-5` and `1E3` are floats (PyYAML's YAML 1.1 rules
    read them as strings), and no python tags."""


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                |\.[0-9_]+(?:[eE][-+][0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def parse_yaml(text: str) -> Any:
    """YAML text as data, numbers read as YAML 1.2 does (`ConfigLoader`)."""
    return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 (a SafeLoader subclass)


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str] | None, where: str = "override") -> dict[str, Any]:
    """A copy of `raw` with each `key=value` applied (value parsed as YAML; the key as `set_key` reads it)."""
    out = copy.deepcopy(raw)
    for item in overrides or []:
        key, text = pair(item, where)
        try:
            value = parse_yaml(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"{where} {key}: the value {text!r} is not valid YAML ({yaml_problem(err)})") from None
        set_key(out, key, value, f"{where} {key}")
    return out


def set_key(raw: dict[str, Any], key: str, value: Any, where: str, merge: bool = False) -> None:
    """Set the dotted `key` of `raw` to `value`, in place (`merge`: a mapping value merges into the mapping there,
    `deep_merge`). Dotted keys reach nested mappings (`a.b=1`, made when
    missing) and list items, by index (`detectors.0.params.k=5`) or by name (`detectors.knn.params.k=5`: the item
    that is that name, or whose `label` or `name` it is; a bare name becomes `{name: ...}`); `where` names the key's
    source in errors."""
    target: Any = raw
    *parents, leaf = key.split(".")
    for depth, name in enumerate(parents):
        here = ".".join(parents[:depth + 1])
        if isinstance(target, list):
            target = _list_item(target, name, where, here)
            continue
        child = target.get(name)
        if child is None:
            child = target[name] = {}
        elif isinstance(child, list):
            target = child
            continue
        elif not isinstance(child, dict):
            raise ConfigError(f"{where}: {here!r} is {type(child).__name__} {child!r} in the config, not a mapping or "
                              "list")
        target = child
    slot: Any = _item_index(target, leaf, where, key) if isinstance(target, list) else leaf
    current = target[slot] if isinstance(target, list) else target.get(slot)
    if merge and isinstance(value, dict) and isinstance(current, dict):
        value = deep_merge(current, value)
    target[slot] = value


def _item_index(items: list[Any], name: str, where: str, key: str) -> int:
    """The position of the list item `name` names: an index, or the item that is / is named / is labelled `name`."""
    if name.lstrip("-").isdigit():
        index = int(name)
        if not -len(items) <= index < len(items):
            raise ConfigError(f"{where}: index {index} is outside the list of {len(items)} items ({key!r})")
        return index % len(items)
    found = [i for i, v in enumerate(items)
             if v == name or (isinstance(v, dict)
                              and (v.get("label") == name or (v.get("name") == name and not v.get("label"))))]
    if len(found) != 1:
        names = [v if isinstance(v, str) else (v.get("label") or v.get("name")) if isinstance(v, dict) else repr(v)
                 for v in items]
        problem = "no item" if not found else f"{len(found)} items"
        raise ConfigError(f"{where}: {problem} named {name!r} in the list{closest(name, [str(n) for n in names])}")
    return found[0]


def _list_item(items: list[Any], name: str, where: str, key: str) -> dict[str, Any]:
    """The mapping at the list item `name` names (a bare string item becomes `{name: item}` in place)."""
    index = _item_index(items, name, where, key)
    if isinstance(items[index], str):
        items[index] = {"name": items[index]}
    if not isinstance(items[index], dict):
        raise ConfigError(f"{where}: the item {key!r} is {items[index]!r}, not a mapping")
    return items[index]

def load_yaml(path: str | os.PathLike, overrides: Sequence[str] | None = None) -> dict[str, Any]:
    """A YAML config file as a mapping, its `base:` chain merged in and overrides applied; a missing file, a YAML
    error or a `base:` cycle is one ConfigError line.

    `base: other.yaml` (relative to the file) names a config this one extends: mappings merge key by key, any other
    value (lists included) replaces the base's."""
    return apply_overrides(_read_with_bases(Path(path), ()), overrides)


def _read_with_bases(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    if not path.is_file():
        named = f" (the base of {display_path(chain[-1])})" if chain else ""
        raise ConfigError(f"{display_path(path)}: no such config file{named}")
    if path.resolve() in chain:
        raise ConfigError(f"{display_path(path)}: `base:` cycle ({' -> '.join(display_path(p) for p in chain)})")
    try:
        raw = parse_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"{display_path(path)}: not valid YAML ({yaml_problem(err)})") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{display_path(path)}: expected a mapping of keys at the top level, got "
                          f"{type(raw).__name__}")
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{display_path(path)}: base: a config file path, got {base!r}")
    return deep_merge(_read_with_bases(path.parent / base, (*chain, path.resolve())), raw)


def deep_merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """`child` over `base`: mappings merge key by key, other values replace."""
    out = dict(base)
    for key, value in child.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def display_path(path: str | os.PathLike) -> str:
    """A path as the user gave it, relative to the working folder when inside it (messages never need more)."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def yaml_problem(err: BaseException) -> str:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem
