"""Training-time detectors from the Open-Insect model zoo's files (`load:`): each method's file, loaded with no
training, scores by its own rule exactly as the re-stated reference network and post-processor compute it
(ConfBranch sigmoid(confidence), G-ODIN max softmax of the cosine numerators (and g), RotPred's log2-KL rule on the
four rotations, ARPL's reciprocal-point MSP, NovelBranch / Extended's closed head and novel score, the plain ResNet-50
methods' MSP or energy, OpenGAN's discriminator on basics' features), and re-scores through `transform` /
`trained_head` with the released closed-set logits."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.open_insect_zoo import make_zoo
from PIL import Image

from detectors.base import FeatureSet, ImageSet
from detectors.registry import detector_class
from pipelines.zoo import ReleasedFileError, released_classifier

pytestmark = pytest.mark.slow  # each method builds and runs a ResNet-50-deep classifier

REGION = "c-america"
CLASSES, AUX = 5, 3


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("weights")
    nets = make_zoo(folder, REGION, CLASSES, aux=AUX)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (136 + 4 * i, 150, 3), dtype=np.uint8)) for i in range(6)]
    basics = released_classifier(folder / f"basics_{REGION}.pth")
    x = basics.preprocess(images)  # the pixels every detector's classifier makes of the images
    return folder, nets, images, basics, x


def load(zoo, name: str, stem: str, **params):
    folder, _, _, basics, _ = zoo
    return detector_class(name).from_pretrained(folder / f"{stem}_{REGION}.pth", classifier=copy.deepcopy(basics),
                                                **params)


def features_of(net, x):
    with torch.no_grad():
        return net.backbone(x, return_feature=True)[1] if hasattr(net, "backbone") else net(x, return_feature=True)[1]


def close(ours, reference):
    np.testing.assert_allclose(ours, np.asarray(reference, dtype=np.float64), rtol=2e-4, atol=1e-5)


def msp(logits):
    return F.softmax(logits.double(), 1).max(1).values.numpy()


@pytest.mark.parametrize("name, stem", [("logitnorm", "logitnorm"), ("oe", "oe"), ("mixoe", "mixoe"), ("udg", "udg"),
                                        ("energy_oe", "energy")])
def test_plain_resnet_methods_score_msp_or_energy_of_their_own_network(zoo, name, stem):
    _, nets, images, _, x = zoo
    det = load(zoo, name, stem)
    assert det.fitted and det.params["mode"] == "full" and det.history == []
    net = nets[stem]
    with torch.no_grad():
        logits = net.fc(features_of(net, x))
    ours = det.score(ImageSet(images=images))
    close(ours, torch.logsumexp(logits.double(), 1).numpy() if name == "energy_oe" else msp(logits))
    if name == "energy_oe":
        close(load(zoo, name, stem, score_rule="msp").score(ImageSet(images=images)), msp(logits))
    seen = det.transform(ImageSet(images=images))  # what rules re-score: the released features and closed logits
    close(seen.features, features_of(net, x))
    close(seen.logits, logits)
    close(det.trained_head(seen.features), logits)


def test_confbranch_scores_its_confidence(zoo):
    _, nets, images, _, x = zoo
    net = nets["conf_branch"]
    with torch.no_grad():
        logits, conf = net(x)
    close(load(zoo, "confbranch", "conf_branch").score(ImageSet(images=images)), torch.sigmoid(conf[:, 0]))
    close(load(zoo, "confbranch", "conf_branch", score_rule="msp").score(ImageSet(images=images)), msp(logits))


def test_godin_scores_the_cosine_numerators_and_g(zoo):
    _, nets, images, _, x = zoo
    net = nets["godin"]
    with torch.no_grad():
        numerators, g = net(x)  # forward(inference=True, score_func='h' / 'g') at noise magnitude 0
    det = load(zoo, "godin", "godin")
    close(det.score(ImageSet(images=images)), msp(numerators))
    close(det.transform(ImageSet(images=images)).logits, numerators)
    feats = det.model_features(ImageSet(images=images))[0]
    close(det.g_score(np.asarray(feats, np.float64)), g[:, 0])


def test_rotpred_scores_its_rotation_rule(zoo):
    _, nets, images, _, x = zoo
    net = nets["rotpred"]
    n = len(x)
    with torch.no_grad():
        rotated = torch.cat([torch.rot90(x, k, [2, 3]) for k in range(4)])
        logits, rot_logits = net(rotated)
    p = F.softmax(logits[:n].double(), 1)
    uniform = torch.full_like(p, 1.0 / p.shape[1])
    cls = (uniform * torch.log2(uniform / p)).sum(1)  # rotpred_postprocessor.py kl_div(uniform, softmax)
    q = F.softmax(rot_logits.double(), 1)
    target = torch.arange(4).repeat_interleave(n)
    rot = -torch.log2(q[torch.arange(4 * n), target]).reshape(4, n).mean(0)  # KL(onehot || q) averaged
    close(load(zoo, "rotpred", "rotpred").score(ImageSet(images=images)), (cls - rot).numpy())


@pytest.mark.parametrize("name", ["novel_branch", "extended"])
def test_branch_methods_score_their_closed_head_and_second_head(zoo, name):
    _, nets, images, _, x = zoo
    net = nets[name]
    with torch.no_grad():
        logits, second = net(x)
    det = load(zoo, name, name)
    assert det.branch_size == CLASSES + (1 if name == "novel_branch" else AUX)
    close(det.score(ImageSet(images=images)), msp(logits))
    novel = load(zoo, name, name, score_rule="novel").score(ImageSet(images=images))
    aux = second[:, CLASSES:].double()
    close(novel, -aux[:, 0] if name == "novel_branch" else -torch.logsumexp(aux, 1))


def test_an_extended_file_is_no_novel_branch(zoo):
    folder = zoo[0]
    (folder / "x").mkdir(exist_ok=True)
    renamed = folder / "x" / f"novel_branch_{REGION}.pth"
    renamed.write_bytes((folder / f"extended_{REGION}.pth").read_bytes())
    with pytest.raises(ReleasedFileError, match=f"fc_extended has {CLASSES + AUX} classes where NovelBranch's"):
        detector_class("novel_branch").from_pretrained(renamed, classifier=copy.deepcopy(zoo[3]))


@pytest.mark.parametrize("part", ["netF", "criterion"])
def test_arpl_reads_both_files_and_scores_reciprocal_point_msp(zoo, part):
    _, nets, images, _, x = zoo
    with torch.no_grad():
        logits = nets["arpl_criterion"](features_of(nets["arpl_netF"], x))  # Sequential(netF, criterion)
    det = load(zoo, "arpl", f"arpl_{part}")
    close(det.score(ImageSet(images=images)), msp(logits))
    seen = det.transform(ImageSet(images=images))
    close(seen.logits, logits)
    close(F.softmax(torch.from_numpy(det.trained_head(seen.features)), 1).numpy(), F.softmax(logits.double(), 1))


def test_opengan_scores_basics_features_with_the_released_discriminator(zoo):
    folder, nets, _, basics, x = zoo
    det = detector_class("opengan").from_pretrained(folder / f"opengan_DNet_{REGION}.ckpt")
    with torch.no_grad():
        feats = basics(x)[1]
        reference = nets["opengan_DNet"](features_of(nets["basics"], x))  # sigmoid(D), opengan_postprocessor.py
    scores = det.score(FeatureSet(features=feats.numpy()))
    close(1 / (1 + np.exp(-scores)), reference)  # ours is D's logit: the same ranking
    same = detector_class("opengan").from_pretrained(folder / f"opengan_GNet_{REGION}.ckpt")  # finds DNet beside
    close(same.score(FeatureSet(features=feats.numpy())), scores)


def test_without_a_run_classifier_the_file_gives_its_own(zoo):
    folder, nets, images, _, x = zoo
    det = detector_class("confbranch").from_pretrained(folder / f"conf_branch_{REGION}.pth")
    with torch.no_grad():
        conf = nets["conf_branch"](x)[1]
    close(det.score(ImageSet(images=images)), torch.sigmoid(conf[:, 0]))


def test_refusals_are_one_line(zoo):
    folder, _, _, basics, _ = zoo
    cases = [("rotpred", f"conf_branch_{REGION}.pth", {}, "is named for conf_branch \\(conf_branch_net\\); rotpred "
                                                          "reads rot_net files"),
             ("mcd", f"basics_{REGION}.pth", {}, "releases no network of this method"),
             ("confbranch", f"conf_branch_{REGION}.pth", {"mode": "heads"}, "mode 'heads' would read"),
             ("arpl", f"basics_{REGION}.pth", {}, "ARPL is released as two files"),
             ("msp", f"basics_{REGION}.pth", {}, "no released network loads as msp")]
    for name, file, params, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            detector_class(name).from_pretrained(folder / file, classifier=copy.deepcopy(basics), **params)
        assert "\n" not in str(err.value)
