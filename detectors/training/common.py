"""What every training-time detector shares: fit = train with pipelines.training, score = a rule on the trained model.

A training-time detector builds an `Objective` (its loss) from its parameters and trains in one of two modes
(parameter `mode`, written to results.csv by the runner):
- "full" (default, the papers' protocol): `fit(ImageSet | Manifest, aux=ImageSet | Manifest)` with `classifier=` given
  at construction fine-tunes that whole classifier in place on images (`pipelines.training.finetune`; the runner hands
  each method its own copy). Training rows get Open-Insect's fine-tuning preprocessor (`augment: region`: Resize to
  the evaluation transform's resize, CenterCrop, flip, RandomCrop with padding 4, new pixels every epoch, JPEGs
  drafted to the crop's need); validation rows and a separate auxiliary stream get the classifier's evaluation pixels
  (`classifier.pixels`: under `open-insects` the reference's Resize + CenterCrop), as the reference's `oe` split
  (docs/training.md). With `work_dir=` (the runner's
  unit folder) the model is checkpointed there after every
  epoch, atomically (safetensors + JSON, no pickle), and a killed run resumes its training; once trained, the detector
  saves itself to `work_dir/model` (`save_pretrained`: heads, config and the fine-tuned classifier's own model folder),
  which `from_pretrained` / the runner's `load:` read back without training. With ID val rows the fine-tune also
  keeps its best epoch by ID-val accuracy (later ties win, the reference's `best.ckpt`); `checkpoint` says which of
  the two scores (the reference protocols: `best`), from one training. `transform(ImageSet)` re-extracts
  features and logits with the fine-tuned model into a cache under `work_dir/features`, keyed by the fine-tuned
  weights, the preprocessing, the precision and the images.
- "heads" (fast studies): `fit(FeatureSet, head=LinearHead, aux=FeatureSet)` trains only the heads on cached
  penultimate features of the frozen classifier (`pipelines.training.train_heads`); the backbone never changes.
The instance's `inputs` says what the runner hands it: {"images"} in full mode, {"features", "logits"} in heads mode.
Either way the trained closed-set head and the method's extra arrays (branch heads, ...) become the detector's state,
and scores are recomputed from features with them (cached logits are not used).

Training x post-hoc scoring: `transform(batch)` gives the FeatureSet as the trained model sees it (its features and the
closed-set logits of its trained head, labels kept) and `trained_head` that head as a `LinearHead`, so any post-hoc
detector can be fitted on `transform(id_train)` with `head=trained_head` and score `transform(split)`. Methods whose
closed-set logits are not a plain linear layer on the features say how they map (G-ODIN: cosine head on L2-normalised
features; ARPL: reciprocal-point logits, linear up to a per-row constant).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from detectors.base import Detector, FeatureSet, ImageSet, LinearHead, as_numpy
from detectors.posthoc.common import logsumexp, softmax
from pipelines.data import Manifest
from pipelines.fingerprint import weights_fingerprint
from pipelines.params import param
from pipelines.training import Objective, TrainSettings, finetune, train_heads
from pipelines.training.loop import Checkpoint

softmax64, logsumexp64 = softmax, logsumexp  # float64 over the class axis of [N, C]: the one definition


def linear_arrays(layer: torch.nn.Linear, prefix: str) -> dict[str, np.ndarray]:
    """A linear layer's weight and bias as float64 arrays named `<prefix>.weight` / `<prefix>.bias`."""
    return {f"{prefix}.weight": as_numpy(layer.weight, np.float64), f"{prefix}.bias": as_numpy(layer.bias, np.float64)}


def apply_linear(state: dict[str, np.ndarray], prefix: str, features: np.ndarray) -> np.ndarray:
    return features @ state[f"{prefix}.weight"].T + state[f"{prefix}.bias"]


class TrainedDetector(Detector):
    """Base of the training-time detectors (family "training"). Subclasses extend `Params` with their method's
    hyperparameters and their `score_rule` Literal (`score_rules` and `modes` are derived from the Literals), and
    implement `objective()` (the loss to train) and `_score_logits(logits, features)`."""

    trains_across_processes = True  # the training loop (pipelines.training) runs on every process together

    @dataclass(frozen=True)
    class Params(TrainSettings):
        """The training hyperparameters (`TrainSettings`: the Open-Insects fine-tuning recipe, 30 epochs, AdamW lr 1e-3,
        weight decay 1e-5, cosine with 2 warm-up epochs, batch 512), the training mode, pixels and scoring."""

        mode: Literal["full", "heads"] = param("full",
                                               "fine-tune the whole classifier on images, or heads on cached features")
        augment: Literal["region", "ami", "none"] = param(
            "region", "full-mode training pixels: the preprocessor branch Open-Insect's finetune.sh selects (resize, "
            "centre crop, flip, RandomCrop with padding 4), its ami branch (RandomResizedCrop 0.3-1, flip, "
            "RandAugment(2, 9)), or the processor's pixels unchanged")
        num_workers: int | None = param(None, "data-loader workers (full mode); null: every core but one beside a GPU, "
                                              "0 on a CPU-only machine", runtime=True, ge=0)
        aux_label_field: str | None = param(None, "manifest field giving auxiliary rows a class index")
        score_batch_size: int = param(64, "images per scoring batch", runtime=True, ge=1)
        score_rule: Literal["msp"] = param("msp", "how the trained model scores")
        checkpoint: Checkpoint = param(
            "last", "which fine-tuned weights score: the last epoch's, or the best ID-val top-1 epoch's, a later epoch "
            "winning a tie (the reference's best.ckpt, base_recorder.py:40-50; needs id_val); the reference protocols: "
            "best (detectors.harness.protocols.CHECKPOINTS)")

    family: ClassVar[str] = "training"
    inputs: ClassVar[frozenset[str]] = frozenset({"images"})  # the default mode's; each instance sets its own
    fit_inputs: ClassVar[frozenset[str]] = frozenset({"head", "id_val", "aux"})
    needs: ClassVar[frozenset[str]] = frozenset({"classifier", "precision", "work_dir"})
    released_network: ClassVar[str | None] = "resnet50"  # the Open-Insect zoo network of its files (pipelines.zoo)
    score_rules: ClassVar[tuple[str, ...]]  # each subclass's: the choices of its Params.score_rule
    modes: ClassVar[tuple[str, ...]]  # each subclass's: the choices of its Params.mode

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.score_rules, cls.modes = cls.Params.choices("score_rule"), cls.Params.choices("mode")

    def __init__(self, classifier: Any = None, work_dir: str | os.PathLike | None = None, **params: Any) -> None:
        """`classifier`: the ImageClassifier to fine-tune in full mode (trained in place; pass a copy to keep yours);
        `work_dir`: where full mode writes its per-epoch checkpoint and its feature caches (none: no resume, no
        cache)."""
        super().__init__(**params)  # Params' Literals check score_rule and mode
        self.inputs = frozenset({"images"}) if self.params["mode"] == "full" else frozenset({"features", "logits"})
        self.classifier = classifier
        self.work_dir = None if work_dir is None else Path(work_dir)
        self.extra: dict[str, np.ndarray] = {}
        self.history: list[dict[str, float]] = []
        self._features_memo: dict[str, tuple[np.ndarray, Any]] = {}
        self._weights_key: str | None = None  # fingerprint of the fine-tuned weights (feature cache keys)

    # -- to implement ---------------------------------------------------------------------------------------
    def objective(self) -> Objective:
        raise NotImplementedError

    def export(self, objective: Objective) -> dict[str, np.ndarray]:
        """Arrays of the trained objective needed for scoring (extra heads); default none."""
        return {}

    def _score_logits(self, logits: np.ndarray, features: np.ndarray) -> np.ndarray:
        return softmax64(logits).max(1)

    def training_transforms(self, transforms: tuple[Any, Any] | None) -> tuple[Any, Any] | None:
        """The (train, eval) pixels of a full-mode fine-tune, given the `augment` branch's; default unchanged (AugMix
        wraps the training transform in its views)."""
        return transforms

    def released_arrays(self, parts: dict[str, Any]) -> dict[str, np.ndarray]:
        """The method's extra arrays (as `export` gives them) from its released network's tensors; default none."""
        return {}

    def released_head(self, parts: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The closed-set head (weight, bias) of its released network; default the network's `fc`."""
        from detectors.training.released import fc_head

        return fc_head(parts)

    # -- released weights (the Open-Insect model zoo) ---------------------------------------------------------
    @classmethod
    def from_released(cls, path: str | os.PathLike, **overrides: Any) -> TrainedDetector:
        """Fitted from its released file, no training (`detectors.training.released`)."""
        from detectors.training.released import load_released

        return load_released(cls, path, **overrides)

    @classmethod
    def check_released(cls, path: str | os.PathLike) -> None:
        from detectors.training.released import read_parts

        read_parts(cls, path)

    # -- protocol -------------------------------------------------------------------------------------------
    def fit(self, id_train: Any, *, head: LinearHead | None = None, id_val: Any = None, ood_val: Any = None,
            aux: Any = None) -> TrainedDetector:
        """Train (see the module docstring for the two modes); `aux` is the auxiliary (outlier-exposure) set.
        `ood_val` is accepted for the protocol; selection on it is the runner's."""
        objective = self.objective()
        if objective.uses_aux and aux is None:
            raise ValueError(f"{self.name} trains with auxiliary data: fit(..., aux=<auxiliary FeatureSet, ImageSet or "
                             "Manifest>)")
        p = self.params
        common = dict(settings=TrainSettings(**{k: p[k] for k in TrainSettings.fields()}), objective=objective)
        aux = aux if objective.uses_aux else None
        if p["checkpoint"] == "best" and id_val is None:
            raise ValueError(f"{self.name}: checkpoint 'best' chooses the fine-tune's epoch by ID validation accuracy: "
                             "fit(..., id_val=...) (or checkpoint: last)")
        if p["mode"] == "heads":
            if not isinstance(id_train, FeatureSet):
                raise TypeError(f"{self.name}: mode 'heads' trains heads on cached features: fit(FeatureSet, "
                                "head=...), "
                                f"got {type(id_train).__name__} (mode 'full' fine-tunes on images)")
            layer, result = self._fit_features(id_train, head, id_val, aux, common)
        else:
            if isinstance(id_train, FeatureSet):
                raise TypeError(f"{self.name}: mode 'full' fine-tunes the classifier on images: fit(ImageSet or "
                                "Manifest); "
                                "pass mode='heads' to train heads on a FeatureSet")
            layer, result = self._fit_images(id_train, id_val, aux, common)
        self.head = LinearHead(as_numpy(layer.weight, np.float64), as_numpy(layer.bias, np.float64))
        self.extra = self.export(objective)
        self.history = result.history
        self._forget_features()
        self.fitted = True
        if self.work_dir is not None:
            self._save_artifact()
        return self

    def _save_artifact(self) -> None:
        """The trained detector as `work_dir/model` (`save_pretrained`, main process): what `load:` reads back."""
        from detectors.training.finetuned import ARTIFACT
        from pipelines.runtime import partial_state

        if partial_state().is_main_process:
            self.save_pretrained(self.work_dir / ARTIFACT)

    def _fit_features(self, id_train: FeatureSet, head: Any, id_val: Any, aux: Any, common: dict[str, Any]):
        id_train.require("features", "labels", who=self.name)
        if head is None:
            torch.manual_seed(self.params["seed"])  # the loop reseeds everything anyway; this makes the random head
                                                    # reproducible
            layer = torch.nn.Linear(id_train.features.shape[1], int(id_train.labels.max()) + 1)
        else:
            layer = head
        if aux is not None and not isinstance(aux, FeatureSet):
            raise TypeError(f"{self.name}: with a FeatureSet for id_train, aux must be a FeatureSet too, got "
                            f"{type(aux).__name__}")
        val = (id_val if isinstance(id_val, FeatureSet) and id_val.features is not None and id_val.labels is not None
               else None)
        return train_heads(layer, id_train.features, id_train.labels,
                           aux_features=None if aux is None else aux.features,
                           aux_labels=None if aux is None or aux.labels is None else aux.labels,
                           val_features=None if val is None else val.features,
                           val_labels=None if val is None else val.labels, weights=self.params["checkpoint"], **common)

    def _fit_images(self, id_train: Any, id_val: Any, aux: Any, common: dict[str, Any]):
        from detectors.training.finetuned import CHECKPOINT, as_manifest, training_key
        from pipelines.fingerprint import preprocessing_fingerprint
        from pipelines.pixels import default_workers, finetune_transforms

        if self.classifier is None:
            raise ValueError(f"{self.name}: mode 'full' fine-tunes a classifier: build({self.name!r}, "
                             "classifier=<ImageClassifier>)")
        train_m, aux_m, val_m = (as_manifest(x, what, self.name) for x, what in ((id_train, "id_train"), (aux, "aux"),
                                                                                 (id_val, "id_val")))
        # training rows: the augment branch; validation and aux rows: the classifier's evaluation pixels
        # (pipelines.pixels)
        transforms = None if self.params["augment"] == "none" else finetune_transforms(self.classifier,
                                                                                       self.params["augment"])
        transforms = self.training_transforms(transforms)
        checkpoint, key = None, ""
        if self.work_dir is not None:
            checkpoint = self.work_dir / CHECKPOINT
            # one training whichever checkpoint scores: both are kept, so switching `checkpoint` trains nothing again
            trained = {k: v for k, v in self.params.items() if k != "checkpoint"}
            pixels = {"pixels": preprocessing_fingerprint(self.classifier),
                      "train": None if transforms is None else transforms[0].identity()}
            key = training_key(self.name, {**trained, **pixels}, self.classifier, train_m, aux_m, val_m)
        workers = default_workers() if self.params["num_workers"] is None else self.params["num_workers"]
        result = finetune(self.classifier, train_m, aux=aux_m, val=val_m, num_workers=workers,
                          aux_label_field=self.params["aux_label_field"], checkpoint=checkpoint, checkpoint_key=key,
                          transforms=transforms, keep_best=checkpoint is not None and val_m is not None,
                          weights=self.params["checkpoint"],
                          **common)
        return self.classifier.head, result

    # -- the trained model as a feature extractor (for post-hoc rules) -----------------------------------------
    def scored_features(self, features: np.ndarray) -> np.ndarray:
        """The features the trained closed-set head reads (default: the features themselves), float64."""
        return features

    def closed_logits(self, features: np.ndarray) -> np.ndarray:
        """The trained model's closed-set logits on float64 `scored_features` (default: the trained linear head)."""
        return self.head(features)

    @property
    def trained_head(self) -> LinearHead:
        """The trained closed-set head on `transform(...).features`: logits = features @ weight.T + bias."""
        self._check_fitted()
        return self.head

    def transform(self, batch: Any) -> FeatureSet:
        """`batch` as the trained model sees it: features read by its closed-set head, that head's logits, labels kept.

        A FeatureSet holds features of the trained model already (heads mode: of the frozen backbone); an ImageSet or
        Manifest (full mode) goes through the fine-tuned classifier once (content-keyed cache under work_dir)."""
        self._check_fitted()
        if isinstance(batch, FeatureSet):
            batch.require("features", who=self.name)
            raw, labels = batch.features, batch.labels
        else:
            raw, labels = self.model_features(batch)
        features = self.scored_features(np.asarray(raw, dtype=np.float64))
        return FeatureSet(features, self.closed_logits(features), labels)

    def model_features(self, batch: Any) -> tuple[np.ndarray, Any]:
        """(penultimate features [N,D], labels) of the fine-tuned classifier on an ImageSet or Manifest; manifest rows
        go through a feature cache under `work_dir/features` keyed by the current weights (kept in memory too)."""
        from detectors.training.finetuned import cached_features, features_key, forward_images

        if self.classifier is None:
            raise ValueError(f"{self.name}: scoring images needs the fine-tuned classifier (build(..., "
                             "classifier=...))")
        p = self.params
        manifest = batch if isinstance(batch, Manifest) else batch.manifest if isinstance(batch, ImageSet) else None
        if manifest is None:
            if isinstance(batch, ImageSet):
                return forward_images(self.classifier, batch, p["score_batch_size"]), batch.labels
            raise TypeError(f"{self.name}: transform/score take a FeatureSet, an ImageSet or a Manifest, got "
                            f"{type(batch).__name__}")
        if self._weights_key is None:
            self._weights_key = weights_fingerprint(self.classifier)
        key = features_key(self._weights_key, self.classifier, manifest, p["precision"])
        if key not in self._features_memo:
            cache_dir = None if self.work_dir is None else self.work_dir / "features"
            self._features_memo[key] = cached_features(self.name, self.classifier, manifest, key, cache_dir,
                                                       p["score_batch_size"], p["precision"])
        return self._features_memo[key]

    def _forget_features(self) -> None:
        """The weights changed (trained, loaded): features computed before are not theirs."""
        self._features_memo.clear()
        self._weights_key = None

    def _check_fitted(self) -> None:
        if not self.fitted or self.head is None:
            raise RuntimeError(f"{self.name}: call fit() (or from_pretrained) first")

    def _score(self, batch: Any) -> np.ndarray:
        seen = self.transform(batch)
        return self._score_logits(seen.logits, seen.features)

    # -- state ----------------------------------------------------------------------------------------------
    def _fine_tuned(self) -> bool:
        return self.params["mode"] == "full" and self.classifier is not None and self.fitted

    def state(self) -> dict[str, np.ndarray]:
        """The trained heads and extra arrays; in full mode also a plain-module classifier's weights (a transformers
        classifier is saved as its own model folder by `save_pretrained`)."""
        from detectors.training.finetuned import classifier_arrays

        out = {**super().state(), **self.extra}
        if self._fine_tuned() and getattr(self.classifier, "kind", None) != "hf":
            out.update(classifier_arrays(self.classifier))
        return out

    def save_pretrained(self, folder: str | os.PathLike) -> Path:
        """`config.json` + `model.safetensors` (heads, extra arrays) and, in full mode with a transformers classifier,
        `classifier/` (the fine-tuned model folder: config, weights, image processor), which `from_pretrained` loads."""
        from detectors.training.finetuned import CLASSIFIER_FOLDER

        folder = Path(folder)
        if self._fine_tuned() and getattr(self.classifier, "kind", None) == "hf":
            self.classifier.model.to(memory_format=torch.contiguous_format)
            self.classifier.save_pretrained(folder / CLASSIFIER_FOLDER)
        return super().save_pretrained(folder)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, **overrides: Any) -> TrainedDetector:
        """A saved trained detector; one holding `classifier/` scores with that fine-tuned classifier (a `classifier`
        given here is replaced by it), one holding a plain module's arrays needs `classifier=` of its architecture."""
        from detectors.training.finetuned import CLASSIFIER_FOLDER

        saved = Path(folder) / CLASSIFIER_FOLDER
        if (saved / "config.json").is_file():
            from pipelines.classifier import ImageClassifier

            overrides["classifier"] = ImageClassifier.from_pretrained(saved)
        return super().from_pretrained(folder, **overrides)

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        from detectors.training.finetuned import CLASSIFIER_PREFIX, load_classifier_arrays

        super().load_state(state)
        self.extra = {k: v for k, v in state.items() if not k.startswith(("head.", CLASSIFIER_PREFIX))}
        if any(k.startswith(CLASSIFIER_PREFIX) for k in state):
            if self.classifier is None:
                raise ValueError(f"{self.name}: this saved detector holds a fine-tuned classifier; load it with "
                                 "from_pretrained(folder, classifier=<an ImageClassifier of the same architecture>)")
            load_classifier_arrays(self.classifier, state)
        self._forget_features()
