"""Golden numbers of OpenOOD's NPOS trainer (npos_trainer.py with npos_net.py's NPOSNet, at
openood_trainers.COMMIT) over one epoch of a few fixed two-view batches, on a stand-in backbone (one Linear layer, so
the BCE's gradient reaches it): prototypes initialised from a fixed "val" batch by the trainer's own
`init_class_prototypes`, then `train_epoch(1)` with numpy's and torch's global generators seeded right before it, so
the queues fill, roll, and (from `start_epoch_KNN` 1) outliers are synthesised; the trainer's own SGD and warm-up lr.
Recorded per step: the loss (read at `backward`), the lr, both CIDER terms, the synthesised points
(`generate_outliers`' returns); and the weights after the epoch.

faiss: the reference builds `faiss.GpuIndexFlatL2(faiss.StandardGpuResources(), D)`; this machine has faiss-cpu
(1.15.1 when the JSON was made), so those two names are stubbed to the CPU `faiss.IndexFlatL2` (the same exact flat
squared-L2 search), with `faiss.contrib.torch_utils` (imported by the trainer) taking the torch tensors. `.to` of a
`torch.device('cuda')` (CompLoss) is the identity, as `.cuda()` is (openood_trainers.load).
Writes npos.json beside this file."""
from __future__ import annotations

import faiss
import numpy as np
import openood_trainers as ref
import torch

D_IN, D, F = 4, 5, 3
CASES = (  # (classes, sample_number, sample_from, K, select, pick_nums, ID_points_num, start_epoch_KNN, sizes, seed)
    (3, 4, 12, 3, 3, 2, 4, 1, (6, 6, 5, 4, 6), 0),
    (2, 5, 10, 2, 4, 3, 2, 1, (4, 4, 3, 4, 3), 1),
    (3, 4, 12, 3, 3, 2, 4, 2, (6, 6, 5, 4), 2),  # KNN from epoch 2: the queues fill and roll, no synthesis
    (3, 3, 12, 3, 3, 2, 4, 1, (4, 4, 4, 4), 3),  # class 2 has a single row: its queue never fills, no synthesis
)


class Backbone(torch.nn.Module):
    feature_size = D

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(D_IN, D)

    def forward(self, x):
        return self.layer(x)


def config(classes, sample_number, sample_from, k, select, pick_nums, id_points, start) -> object:
    return ref.namespace({
        "dataset": {"name": "cifar10", "num_classes": classes, "train": {"batch_size": 8}},
        "num_gpus": 1, "num_machines": 1, "network": {"feat_dim": F},
        "optimizer": {"lr": 0.5, "momentum": 0.9, "weight_decay": 0.0001, "warm": True, "cosine": True,
                      "lr_decay_rate": 0.1, "num_epochs": 100, "lr_decay_epochs": [30, 50, 120],
                      "mlp_decay_rate": 0.1},
        "trainer": {"trainer_args": {"proto_m": 0.95, "temp": 0.1, "sample_number": sample_number,
                                     "sample_from": sample_from, "start_epoch_KNN": start, "K": k, "cov_mat": 0.1,
                                     "select": select, "ID_points_num": id_points, "pick_nums": pick_nums,
                                     "w_disp": 0.5, "w_comp": 1, "loss_weight": 0.1}}})


def labels(rng, classes: int, n: int, index: int, case_seed: int) -> np.ndarray:
    if case_seed == 3:  # classes 0 and 1 only, but one row of class 2 in the first batch
        y = np.arange(n) % 2
        if index == 0:
            y[-1] = 2
        return y
    return np.arange(n) % classes if index < 2 else rng.integers(0, classes, n)


def case(trainer_module, net_module, classes, sample_number, sample_from, k, select, pick_nums, id_points, start,
         sizes, seed) -> dict:
    rng = np.random.default_rng(seed)
    net = net_module.NPOSNet(Backbone(), head="mlp", feat_dim=F, num_classes=classes)
    modules = {"backbone": net.backbone.layer, "head": net.head, "mlp": net.mlp}
    weights = {part: {n: ref.rounded(rng, tuple(p.shape), 0.5) for n, p in m.named_parameters()}
               for part, m in modules.items()}
    with torch.no_grad():
        for part, m in modules.items():
            for n, p in m.named_parameters():
                p.copy_(torch.from_numpy(weights[part][n]))
    val_x = ref.rounded(rng, (2 * classes + 1, D_IN))
    val_y = np.arange(len(val_x)) % classes
    batches = []
    for i, n in enumerate(sizes):
        y = labels(rng, classes, n, i, seed)
        views = [ref.rounded(rng, (n, D_IN)) + np.float32(0.7) * y[:, None].astype(np.float32) for _ in range(2)]
        batches.append({"data": [torch.from_numpy(v) for v in views], "label": torch.from_numpy(y)})
    val = [{"data": torch.from_numpy(val_x), "label": torch.from_numpy(val_y)}]
    trainer = trainer_module.NPOSTrainer(net, ref.Batches(batches), val,
                                         config(classes, sample_number, sample_from, k, select, pick_nums, id_points,
                                                start))
    initial = trainer.criterion_disp.prototypes.clone()
    steps: list[dict] = []
    terms: dict = {}
    trainer.criterion_disp.register_forward_hook(lambda m, i, o: terms.__setitem__("disp", float(o.detach())))
    trainer.criterion_comp.register_forward_hook(lambda m, i, o: terms.__setitem__("comp", float(o.detach())))
    generate = trainer_module.generate_outliers
    outliers: list = []

    def recorded_generate(*args, **kwargs):
        out = generate(*args, **kwargs)
        outliers.append(ref.as_list(out))
        return out

    trainer_module.generate_outliers = recorded_generate
    backward = torch.Tensor.backward

    def record(tensor, *args, **kwargs):
        steps.append({"loss": float(tensor.detach()), "lr": trainer.optimizer.param_groups[0]["lr"],
                      "lrs": [g["lr"] for g in trainer.optimizer.param_groups], **terms,
                      "outliers": list(outliers)})
        outliers.clear()
        return backward(tensor, *args, **kwargs)

    torch.Tensor.backward = record
    np.random.seed(seed)
    torch.manual_seed(seed)
    trainer.train_epoch(1)
    torch.Tensor.backward = backward
    trainer_module.generate_outliers = generate
    return {"classes": classes, "sample_number": sample_number, "sample_from": sample_from, "K": k, "select": select,
            "pick_nums": pick_nums, "ID_points_num": id_points, "start_epoch_KNN": start, "seed": seed,
            "inputs": {"weights": {part: {n: ref.as_list(v) for n, v in w.items()} for part, w in weights.items()},
                       "val_x": ref.as_list(val_x), "val_y": val_y.tolist(),
                       "batches": [{"views": [ref.as_list(v) for v in b["data"]], "y": b["label"].tolist()}
                                   for b in batches]},
            "initial_prototypes": ref.as_list(initial), "steps": steps,
            "queue_counts": [trainer.number_dict[c] for c in range(classes)],
            "stepped": {part: {n: ref.as_list(p) for n, p in m.named_parameters()} for part, m in modules.items()}}


def main() -> None:
    faiss.StandardGpuResources = lambda: None
    faiss.GpuIndexFlatL2 = lambda resources, dim: faiss.IndexFlatL2(dim)
    to = torch.Tensor.to

    def cpu_to(self, *args, **kwargs):
        if args and isinstance(args[0], torch.device) and args[0].type == "cuda":
            return self
        return to(self, *args, **kwargs)

    trainer_module, net_module = ref.load("openood/trainers/npos_trainer.py", "openood/networks/npos_net.py")
    torch.Tensor.to = cpu_to
    torch.manual_seed(0)
    cases = [case(trainer_module, net_module, *c) for c in CASES]
    print(ref.write("npos", "make_npos.py", {
        "faiss": f"faiss-cpu {faiss.__version__} IndexFlatL2 for the reference's GpuIndexFlatL2",
        "defaults": {"proto_m": 0.95, "temp": 0.1, "sample_number": 1000, "sample_from": 600, "start_epoch_knn": 40,
                     "synthesis_k": 300, "cov_mat": 0.1, "select": 200, "id_points_num": 200, "pick_nums": 2,
                     "w_disp": 0.5, "w_comp": 1.0, "loss_weight": 0.1, "feat_dim": 128},
        "cases": cases}))


if __name__ == "__main__":
    main()
