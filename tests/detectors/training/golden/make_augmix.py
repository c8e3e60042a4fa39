"""Golden numbers of OpenOOD's AugMix trainer (augmix_trainer.py at openood_trainers.COMMIT): one `train_epoch` of one
batch on tiny.py's network, the three views given (the trainer takes them ready-made from its preprocessor), recorded:
the loss read at `backward` and every weight after the trainer's own SGD (nesterov) + cosine LambdaLR step. Cases: the
JSD loss at the config's lam 12, a batch of 1, a single class, logits large enough for the mixture's 1e-7 clamp, and
jsd off (plain CE on the one view). The inputs are rebuilt by `inputs` (tests import it), not stored.
Writes augmix.json beside this file:
    python tests/detectors/training/golden/make_augmix.py
"""
from __future__ import annotations

import numpy as np
import openood_trainers as ref
import torch
from tiny import CLASSES, TinyNet, batch, state_to_json

OPTIMIZER = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005, "num_epochs": 100}  # train_augmix.yml:25-30
CASES = {  # name: (rows, classes, jsd, lam, fc scale)
    "jsd": (4, CLASSES, True, 12.0, 1.0),
    "batch_of_one": (1, CLASSES, True, 12.0, 1.0),
    "one_class": (4, 1, True, 12.0, 1.0),
    "clamped": (4, CLASSES, True, 12.0, 400.0),
    "no_jsd": (4, CLASSES, False, 12.0, 1.0),
}


def inputs(name: str) -> tuple[TinyNet, dict[str, torch.Tensor]]:
    """The case's starting network and batch: tiny.batch()'s rows as the clean view, two perturbed copies as the
    AugMix views (noise of 4-decimal values)."""
    rows, classes, _, _, scale = CASES[name]
    torch.manual_seed(0)
    net = TinyNet(classes=classes)
    with torch.no_grad():
        net.fc.weight.mul_(scale)
    x, y = batch()
    rng = np.random.default_rng(7)
    augs = [x + torch.from_numpy(ref.rounded(rng, tuple(x.shape), 0.5)) for _ in range(2)]
    y = y % classes
    return net, {"data": x[:rows], "data_aug1": augs[0][:rows], "data_aug2": augs[1][:rows], "label": y[:rows]}


def case(module, name: str) -> dict:
    _, _, jsd, lam, _ = CASES[name]
    net, data = inputs(name)
    config = ref.namespace({"trainer": {"trainer_args": {"lam": lam, "jsd": jsd}}, "optimizer": OPTIMIZER})
    trainer = module.AugMixTrainer(net, ref.Batches([{k: v.clone() for k, v in data.items()}]), config)
    losses, backward = [], torch.Tensor.backward

    def record(self, *args, **kwargs):
        losses.append(float(self.detach()))
        return backward(self, *args, **kwargs)

    torch.Tensor.backward = record
    try:
        trainer.train_epoch(0)
    finally:
        torch.Tensor.backward = backward
    return {"rows": CASES[name][0], "classes": CASES[name][1], "jsd": jsd, "lam": lam, "loss": losses[0],
            "updated": state_to_json(net)}


def main() -> None:
    torch.set_num_threads(1)
    [module] = ref.load("openood/trainers/lr_scheduler.py", "openood/trainers/augmix_trainer.py")[1:]
    print(ref.write("augmix", "make_augmix.py", {"optimizer": OPTIMIZER,
                                                  "cases": {name: case(module, name) for name in CASES}}))


if __name__ == "__main__":
    main()
