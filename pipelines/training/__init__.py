"""The shared training loop: classifier training (named recipes), fine-tuning, heads-only training on cached features,
multi-granularity heads; per-epoch atomic checkpoints and resume; the same weights on 1 or N processes.

- `objectives`: `Objective`, `TrainBatch`, `Pass`, `CrossEntropy`, `MultiGranularity`;
- `loaders`: image rows, cached-feature batches, the epoch-seeded sampler; `transforms`: torchvision's ops without
  torchvision (RandAugment, RandomResizedCrop, Resize, CenterCrop, RandomCrop, flip) and Open-Insect's preprocessors;
- `augmix`: torchvision's AugMix without torchvision and OpenOOD's clean + two AugMix views;
- `schedule`: the "clean" and the "reference" (Open-Insect's step counter) lr schedules;
- `settings`: `TrainSettings`, the training hyperparameters (defaults, ranges, docs) everything below reads;
- `loop`: `finetune` (a whole `ImageClassifier` on images), `train_heads` (linear heads on cached features);
- `batchnorm`: batch norm over the global batch across processes; `recipes` (recipes, protocols, `TrainConfig`) +
`classify`: `train_classifier(config)`
  behind `scripts/train_classifier.py`; `bench`: the measurements of `benchmarks/train.py`.
"""
from pipelines.training.loaders import aux_batch_size
from pipelines.training.loop import LoopSettings, TrainResult, as_linear, finetune, train_heads
from pipelines.training.objectives import PRIMARY, CrossEntropy, MultiGranularity, Objective, Pass, TrainBatch
from pipelines.training.settings import TrainSettings

__all__ = ["PRIMARY", "CrossEntropy", "LoopSettings", "MultiGranularity", "Objective", "Pass", "TrainBatch",
           "TrainResult", "TrainSettings", "as_linear", "aux_batch_size", "finetune", "train_heads"]
