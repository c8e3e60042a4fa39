"""Golden numbers of OpenOOD's ReweightOOD (reweightood_trainer.py with cider_net.py's CIDERNet and
reweightood_postprocessor.py, at openood_trainers.COMMIT): one `train_epoch(1)` over one two-view batch with a stand-in
backbone whose features are the inputs (the step trains the MLP projection head on fixed features, as heads mode does;
the loss read at the trainer's ELU, its SGD step with the warm-up lr), and the postprocessor's scores (class means and
sklearn's EmpiricalCovariance of the normalised train features, dataset cifar10: 10 classes).
Writes reweightood.json beside this file."""
from __future__ import annotations

import numpy as np
import openood_trainers as ref
import torch

D, F = 6, 4
ARGS = {"temp": 0.1, "m_b": 5.0, "c_b": 4.0, "m_w": 2.0, "c_w": 1.0}
CASES = ((3, 6, 0), (3, 1, 1), (1, 4, 2), (4, 5, 3))  # (classes, batch rows (two views each), seed)


class Backbone(torch.nn.Module):
    feature_size = D

    def forward(self, x):
        return x


def config(rows: int) -> object:
    return ref.namespace({
        "dataset": {"name": "cifar10", "train": {"batch_size": rows}}, "num_gpus": 1, "num_machines": 1,
        "optimizer": {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0001, "warm": True, "cosine": True,
                      "lr_decay_rate": 0.1, "num_epochs": 100, "lr_decay_epochs": [50, 75, 90]},
        "trainer": {"trainer_args": ARGS}})


def step(trainer_module, net_module, classes: int, rows: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    net = net_module.CIDERNet(Backbone(), head="mlp", feat_dim=F, num_classes=classes)
    weights = {name: ref.rounded(rng, tuple(p.shape), 0.5) for name, p in net.head.named_parameters()}
    with torch.no_grad():
        for name, p in net.head.named_parameters():
            p.copy_(torch.from_numpy(weights[name]))
    views = [ref.rounded(rng, (rows, D)), ref.rounded(rng, (rows, D))]
    y = rng.integers(0, classes, rows)
    trainer = trainer_module.ReweightOODTrainer(net, ref.Batches([{"data": [torch.from_numpy(v) for v in views],
                                                                   "label": torch.from_numpy(y)}]), config(rows))
    seen = {}
    trainer.elu.register_forward_hook(lambda m, i, o: seen.__setitem__("loss", float(o.detach())))
    trainer.train_epoch(1)
    return {"classes": classes, "seed": seed,
            "inputs": {"weights": {k: ref.as_list(v) for k, v in weights.items()},
                       "views": [ref.as_list(v) for v in views], "y": y.tolist()},
            "loss": seen["loss"], "lr": trainer.optimizer.param_groups[0]["lr"],
            "grads": {n: ref.as_list(p.grad) for n, p in net.head.named_parameters()},
            "stepped": {n: ref.as_list(p) for n, p in net.head.named_parameters()}}


def scores(post_module, net_module) -> dict:
    rng = np.random.default_rng(9)
    net = net_module.CIDERNet(Backbone(), head="mlp", feat_dim=F, num_classes=10)
    train_x = ref.rounded(rng, (60, D)) + np.float32(0.3)
    train_y = np.arange(60) % 10
    test_x = ref.rounded(rng, (15, D))
    post = post_module.ReweightOODPostprocessor(ref.namespace({"dataset": {"name": "cifar10"}}))
    loader = [{"data": torch.from_numpy(train_x[i:i + 16]), "label": torch.from_numpy(train_y[i:i + 16])}
              for i in range(0, 60, 16)]
    post.setup(net, {"train": loader}, {})
    conf = post.postprocess(net, torch.from_numpy(test_x))[1]
    return {"train_x": ref.as_list(train_x), "train_y": train_y.tolist(), "test_x": ref.as_list(test_x),
            "scores": ref.as_list(conf)}


def main() -> None:
    trainer_module, net_module, _, _, post_module = ref.load(
        "openood/trainers/reweightood_trainer.py", "openood/networks/cider_net.py",
        "openood/postprocessors/base_postprocessor.py", "openood/postprocessors/info.py",
        "openood/postprocessors/reweightood_postprocessor.py")
    torch.manual_seed(0)
    cases = [step(trainer_module, net_module, *c) for c in CASES]
    print(ref.write("reweightood", "make_reweightood.py",
                    {"defaults": ARGS, "cases": cases, "postprocessor": scores(post_module, net_module)}))


if __name__ == "__main__":
    main()
