"""Golden numbers of one training step of OpenOOD's CIDER trainer (cider_trainer.py with cider_net.py's CIDERNet, at
openood_trainers.COMMIT): a stand-in backbone whose features are the inputs (so the step trains the MLP projection head
on fixed features, as heads mode does), prototypes initialised from a fixed "val" batch by the trainer's own
`init_class_prototypes`, then `train_epoch(1)` over one two-view batch (its SGD step, warm-up lr included). Recorded:
the initial and updated prototypes, both loss terms, the head's gradients and weights after the step; and the
postprocessor's scores (cider_postprocessor.py, faiss IndexFlatL2) on fixed features.
Writes cider.json beside this file."""
from __future__ import annotations

import numpy as np
import openood_trainers as ref
import torch

D, F = 6, 4
CASES = ((3, 6, 7, 0), (3, 1, 5, 1), (4, 5, 9, 2))  # (classes, batch rows (two views each), val rows, seed)


class Backbone(torch.nn.Module):
    feature_size = D

    def forward(self, x):
        return x


def config(classes: int, rows: int) -> object:
    return ref.namespace({
        "dataset": {"name": "cifar10", "num_classes": classes, "train": {"batch_size": rows}},
        "num_gpus": 1, "num_machines": 1, "network": {"feat_dim": F},
        "optimizer": {"lr": 0.5, "momentum": 0.9, "weight_decay": 0.0001, "warm": True, "cosine": True,
                      "lr_decay_rate": 0.1, "num_epochs": 100, "lr_decay_epochs": [50, 75, 90]},
        "trainer": {"trainer_args": {"proto_m": 0.95, "temp": 0.1, "w": 2}}})


def case(trainer_module, net_module, classes: int, rows: int, val_rows: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    net = net_module.CIDERNet(Backbone(), head="mlp", feat_dim=F, num_classes=classes)
    weights = {name: ref.rounded(rng, tuple(p.shape), 0.5) for name, p in net.head.named_parameters()}
    with torch.no_grad():
        for name, p in net.head.named_parameters():
            p.copy_(torch.from_numpy(weights[name]))
    val_x = ref.rounded(rng, (val_rows, D))
    val_y = np.arange(val_rows) % classes  # every class in val (the reference divides by its count)
    views = [ref.rounded(rng, (rows, D)), ref.rounded(rng, (rows, D))]
    y = rng.integers(0, classes, rows)
    val = [{"data": torch.from_numpy(val_x), "label": torch.from_numpy(val_y)}]
    trainer = trainer_module.CIDERTrainer(net, ref.Batches([{"data": [torch.from_numpy(v) for v in views],
                                                 "label": torch.from_numpy(y)}]), val, config(classes, rows))
    initial = trainer.criterion_dis.prototypes.clone()
    seen = {}
    trainer.criterion_dis.register_forward_hook(lambda m, i, o: seen.__setitem__("dis", float(o.detach())))
    trainer.criterion_comp.register_forward_hook(lambda m, i, o: seen.__setitem__("comp", float(o.detach())))
    trainer.train_epoch(1)
    return {"classes": classes, "seed": seed,
            "inputs": {"weights": {k: ref.as_list(v) for k, v in weights.items()}, "val_x": ref.as_list(val_x),
                       "val_y": val_y.tolist(), "views": [ref.as_list(v) for v in views], "y": y.tolist()},
            "initial_prototypes": ref.as_list(initial), "prototypes": ref.as_list(trainer.criterion_dis.prototypes),
            "dis": seen["dis"], "comp": seen["comp"], "loss": 2 * seen["comp"] + seen["dis"],
            "lr": trainer.optimizer.param_groups[0]["lr"],
            "grads": {n: ref.as_list(p.grad) for n, p in net.head.named_parameters()},
            "stepped": {n: ref.as_list(p) for n, p in net.head.named_parameters()}}


def scores(post_module, net_module) -> dict:
    """The postprocessor (K 5 here) on the normalised features of the stand-in backbone."""
    rng = np.random.default_rng(9)
    net = net_module.CIDERNet(Backbone(), head="mlp", feat_dim=F, num_classes=3)
    train_x, test_x = ref.rounded(rng, (40, D)) + np.float32(0.3), ref.rounded(rng, (15, D))
    post = post_module.CIDERPostprocessor(ref.namespace({"postprocessor": {"postprocessor_args": {"K": 5},
                                                                           "postprocessor_sweep": {}}}))
    post.setup(net, {"train": [{"data": torch.from_numpy(train_x[i:i + 16])} for i in range(0, 40, 16)]}, {})
    conf = post.postprocess(net, torch.from_numpy(test_x))[1]
    return {"k": 5, "train_x": ref.as_list(train_x), "test_x": ref.as_list(test_x), "scores": ref.as_list(conf)}


def main() -> None:
    trainer_module, net_module, _, post_module = ref.load(
        "openood/trainers/cider_trainer.py", "openood/networks/cider_net.py",
        "openood/postprocessors/base_postprocessor.py", "openood/postprocessors/cider_postprocessor.py")
    torch.manual_seed(0)
    cases = [case(trainer_module, net_module, *c) for c in CASES]
    print(ref.write("cider", "make_cider.py", {"defaults": {"proto_m": 0.95, "temp": 0.1, "w": 2, "feat_dim": 128},
                                               "cases": cases, "postprocessor": scores(post_module, net_module)}))


if __name__ == "__main__":
    main()
