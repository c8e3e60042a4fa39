"""Plan checks of released weight files (`pipelines.zoo`: the Open-Insect model zoo) named by `model:` and by
detector entries' `load:`: each file is read tensors only and its keys checked against its network, its class count
against the run's ID classes (and the run classifier's), OpenGAN's discriminator against the classifier's feature
width; every fault is one ConfigError line naming the key and the file, before any model is built."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from detectors.base import Detector
from pipelines.errors import ConfigError, UserInputError
from pipelines.openood_checkpoints import is_openood_checkpoint
from pipelines.zoo import ReleasedNetwork, check_class_count, is_released_file, read_released


def id_classes(config: Any, splits: Sequence[Any]) -> int | None:
    """The run's ID class count: `class_names`, else the largest ID label + 1 (None without labelled ID rows)."""
    if config.class_names:
        return len(config.class_names)
    labels = [int(r["label"]) for s in splits if s.role == "id" for r in s.manifest.rows if int(r["label"]) >= 0]
    return max(labels) + 1 if labels else None


def check_released_classes(config: Any, classes: Sequence[type[Detector]], splits: Sequence[Any]) -> None:
    """The checks of the module docstring for `config.model` and every `load:` that is a released file."""
    want = id_classes(config, splits)
    whose = f"the ID rows (id: {config.id})"
    model = None
    if is_released_file(config.model) and not is_openood_checkpoint(config.model):  # OpenOOD's: its own loader
        try:
            model = read_released(config.model, config.model_network)
        except UserInputError as err:
            raise ConfigError(f"model: {err}") from None
        if "fc" not in model.heads:
            raise ConfigError(f"model: {model.path}: {model.network} has no linear closed-set head (fc) to be the "
                              "run's classifier; load it as its method's detector (`load:`) with the region's "
                              "basics_<region>.pth as `model:`")
        if want is not None:
            try:
                check_class_count(model, want, whose)
            except UserInputError as err:
                raise ConfigError(f"model: {err}") from None
    for i, (spec, cls) in enumerate(zip(config.specs(), classes)):
        if spec.load and is_released_file(spec.load):
            _check_load(cls, spec.load, f"detectors[{i}].load", want, whose, model)


def _check_load(cls: type[Detector], path: str, where: str, want: int | None, whose: str,
                model: ReleasedNetwork | None) -> None:
    try:
        if cls.family == "training":
            from detectors.training.released import read_parts

            parts = read_parts(cls, path)
            if want is not None:
                check_class_count(parts.get("criterion", parts["network"]), want, whose)
            if model is not None and parts["network"].backbone and parts["network"].feature_dim != model.feature_dim:
                raise ConfigError(f"{where}: {path}: {parts['network'].feature_dim} features where the run's "
                                  f"classifier (model: {model.path}) has {model.feature_dim}")
        else:
            cls.check_released(path)
            if cls.name == "opengan" and model is not None:
                from detectors.generative.opengan import released_discriminator

                dim = int(released_discriminator(path)["net.0.weight"].shape[1])
                if dim != model.feature_dim:
                    raise ConfigError(f"{where}: {path}: the discriminator reads {dim} features where the run's "
                                      f"classifier (model: {model.path}) has {model.feature_dim}")
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        text = str(err)
        raise ConfigError(f"{where}: {text if text.startswith(cls.name) else f'{cls.name}: {text}'}") from None
