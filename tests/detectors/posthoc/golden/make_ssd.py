"""Golden statistics and scores of OpenOOD's SSD postprocessor (ssd_postprocessor.py at openood_ref.COMMIT, with
configs/postprocessors/ssd.yml's feature_type_list [mean] and reduce_dim_list [none]).

The network is OpenOOD's own SimClrNet (openood/networks/simclr_net.py) around a stand-in backbone whose feature is
its input h, with the projection head the identity: its feature list is [F.normalize(h)]. `SSDPostprocessor.setup`
fits one cluster (`get_MDS_stat` with num_classes 1) on the ID train batches; it indexes that one-cluster list with
the true labels, so the labels given are 0. It has no `postprocess` of its own (the base class's MSP of `net(data)`,
a tuple from SimClrNet), so the scores here are those of the function its statistics are made for,
`compute_Mahalanobis_score` of mds_ensemble_postprocessor.py with those statistics and magnitude 0: max over the one
cluster of -0.5 (f - mu)^T P (f - mu). Writes ssd.json beside this file."""
from __future__ import annotations

import importlib

import numpy as np
import openood_ref
import torch

D = 8


class Backbone(torch.nn.Module):
    """`forward(x, return_feature=True)` = (x, x): the input is the feature."""

    feature_size = D

    def forward(self, x, return_feature=False):
        return (x, x) if return_feature else x


def run(post_module, mds_module, net_module, train: np.ndarray, test: np.ndarray):
    config = openood_ref.config(noise=0.0014, feature_type_list=["mean"], alpha_list=[1], reduce_dim_list=["none"])
    post = post_module.SSDPostprocessor(config)
    net = net_module.SimClrNet(Backbone(), out_dim=D)
    net.simclr_head = torch.nn.Identity()
    batches = [{"data_aux": torch.from_numpy(train[i:i + 16].copy()),
                "label": torch.zeros(len(train[i:i + 16]), dtype=torch.int64)} for i in range(0, len(train), 16)]
    post.setup(net, {"train": batches}, {})
    data = torch.from_numpy(test.copy()).requires_grad_(True)
    score = mds_module.compute_Mahalanobis_score(net, data, 1, post.feature_mean, post.feature_prec,
                                                 post.transform_matrix, 0, post.feature_type_list, 0.0)
    return (score.detach().numpy().astype(np.float64), post.feature_mean[0].numpy().astype(np.float64),
            post.feature_prec[0].numpy().astype(np.float64))


def main() -> None:
    post_module = openood_ref.load("ssd_postprocessor", extra=("openood/postprocessors/mds_ensemble_postprocessor.py",
                                                               "openood/postprocessors/info.py",
                                                               "openood/networks/simclr_net.py"))
    mds_module = importlib.import_module("openood.postprocessors.mds_ensemble_postprocessor")
    net_module = importlib.import_module("openood.networks.simclr_net")
    torch.Tensor.cuda = lambda self, *a, **k: self  # the reference moves tensors to CUDA; this runs on the CPU
    rng = np.random.default_rng(39)
    scale = np.linspace(0.3, 2.0, D, dtype=np.float32)
    train = np.round(openood_ref.rounded(rng, (64, D)) * scale + np.float32(0.8), 4).astype(np.float32)
    test = np.concatenate([np.round(openood_ref.rounded(rng, (16, D)) * scale + np.float32(0.8), 4),
                           openood_ref.rounded(rng, (12, D), 1.5)]).astype(np.float32)
    cases = []
    for rows in (64, 5):  # N > D; D > N (a singular covariance: pinvh)
        scores, mean, precision = run(post_module, mds_module, net_module, train[:rows], test)
        cases.append({"rows": rows, "scores": openood_ref.as_list(scores), "mean": openood_ref.as_list(mean),
                      "precision": openood_ref.as_list(precision)})
    payload = {"inputs": {"train": openood_ref.as_list(train), "test": openood_ref.as_list(test)}, "cases": cases}
    print(openood_ref.write("ssd", "make_ssd.py", payload))


if __name__ == "__main__":
    main()
