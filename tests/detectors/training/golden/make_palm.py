"""Golden numbers of one training step of OpenOOD's PALM trainer (palm_trainer.py with palm_net.py's PALMNet, at
openood_trainers.COMMIT): a stand-in backbone whose features are the inputs (the step trains the MLP projection head on
fixed features, as heads mode does), the trainer's own random prototypes (torch seeded), `train_epoch(1)` over one
two-view batch (its SGD step, warm-up lr included). Recorded: the initial and moved prototypes, both loss terms, the
head's gradients and weights after the step; and the scores of the `mds` postprocessor OpenOOD evaluates PALM with
(scripts/eval_ood.py:130-136) on PALMNet's normalised backbone features (dataset cifar10: 10 classes).
Writes palm.json beside this file."""
from __future__ import annotations

import numpy as np
import openood_trainers as ref
import torch

D, F = 6, 4
ARGS = {"proto_m": 0.999, "n_proto": 6, "k": 5, "temp": 0.1, "nviews": 2, "epsilon": 0.05, "sinkhorn_iter": 3,
        "lambda_pcon": 1}
CASES = ((3, 6, {}, 0), (3, 1, {}, 1), (1, 4, {}, 2), (4, 5, {"k": 0, "n_proto": 3, "proto_m": 0.9}, 3),
         (2, 4, {"lambda_pcon": 0, "k": 9}, 4))  # (classes, batch rows (two views each), args over ARGS, seed)


class Backbone(torch.nn.Module):
    feature_size = D

    def forward(self, x):
        return x


def config(classes: int, rows: int, args: dict) -> object:
    return ref.namespace({
        "dataset": {"name": "cifar10", "num_classes": classes, "train": {"batch_size": rows}},
        "num_gpus": 1, "num_machines": 1, "network": {"feat_dim": F},
        "optimizer": {"lr": 0.5, "momentum": 0.9, "weight_decay": 0.0001, "warm": True, "cosine": True,
                      "lr_decay_rate": 0.1, "num_epochs": 100, "lr_decay_epochs": [50, 75, 90]},
        "trainer": {"trainer_args": {**ARGS, **args}}})


def step(trainer_module, net_module, classes: int, rows: int, args: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    net = net_module.PALMNet(Backbone(), head="mlp", feat_dim=F, num_classes=classes)
    weights = {name: ref.rounded(rng, tuple(p.shape), 0.5) for name, p in net.head.named_parameters()}
    with torch.no_grad():
        for name, p in net.head.named_parameters():
            p.copy_(torch.from_numpy(weights[name]))
    views = [ref.rounded(rng, (rows, D)), ref.rounded(rng, (rows, D))]
    y = rng.integers(0, classes, rows)
    batch = {"data": [torch.from_numpy(v) for v in views], "label": torch.from_numpy(y)}
    trainer = trainer_module.PALMTrainer(net, ref.Batches([batch]), config(classes, rows, args))
    initial = trainer.protos.clone()
    seen = {}
    mle, contra = trainer.mle_loss, trainer.proto_contra
    trainer.mle_loss = lambda *a: seen.setdefault("mle", mle(*a))
    trainer.proto_contra = lambda: seen.setdefault("pcon", contra())
    trainer.train_epoch(1)
    terms = {k: float(v.detach()) for k, v in seen.items()}
    return {"classes": classes, "seed": seed, "args": {**ARGS, **args},
            "inputs": {"weights": {k: ref.as_list(v) for k, v in weights.items()},
                       "views": [ref.as_list(v) for v in views], "y": y.tolist()},
            "initial_prototypes": ref.as_list(initial), "prototypes": ref.as_list(trainer.protos),
            "mle": terms["mle"], "pcon": terms.get("pcon"),
            "loss": terms["mle"] + args.get("lambda_pcon", ARGS["lambda_pcon"]) * terms.get("pcon", 0.0),
            "lr": trainer.optimizer.param_groups[0]["lr"],
            "grads": {n: ref.as_list(p.grad) for n, p in net.head.named_parameters()},
            "stepped": {n: ref.as_list(p) for n, p in net.head.named_parameters()}}


def scores(post_module, net_module) -> dict:
    rng = np.random.default_rng(9)
    net = net_module.PALMNet(Backbone(), head="mlp", feat_dim=F, num_classes=10)
    train_x = ref.rounded(rng, (60, D)) + np.float32(0.3)
    train_y = np.arange(60) % 10
    test_x = ref.rounded(rng, (15, D))
    post = post_module.MDSPostprocessor(ref.namespace({"dataset": {"name": "cifar10"}}))
    loader = [{"data": torch.from_numpy(train_x[i:i + 16]), "label": torch.from_numpy(train_y[i:i + 16])}
              for i in range(0, 60, 16)]
    post.setup(net, {"train": loader}, {})
    conf = post.postprocess(net, torch.from_numpy(test_x))[1]
    return {"train_x": ref.as_list(train_x), "train_y": train_y.tolist(), "test_x": ref.as_list(test_x),
            "scores": ref.as_list(conf)}


def main() -> None:
    trainer_module, net_module, _, _, post_module = ref.load(
        "openood/trainers/palm_trainer.py", "openood/networks/palm_net.py",
        "openood/postprocessors/base_postprocessor.py", "openood/postprocessors/info.py",
        "openood/postprocessors/mds_postprocessor.py")
    cases = [step(trainer_module, net_module, *c) for c in CASES]
    print(ref.write("palm", "make_palm.py", {"defaults": ARGS, "cases": cases,
                                             "postprocessor": scores(post_module, net_module)}))


if __name__ == "__main__":
    main()
