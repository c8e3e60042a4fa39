"""pipelines.zoo: the Open-Insect model zoo's files read as published. Stand-ins (tests/helpers/open_insect_zoo.py)
are the reference networks re-stated in torch with their attribute names, at tiny widths and ResNet-50's depth, saved
as the zoo has them; a file is identified by its keys, its name checked against them, its class count read from its
tensors, and the loaded classifier's logits and features equal the re-stated network's forward."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from helpers.open_insect_zoo import DEPTHS, EMBEDDING, WIDTHS, make_zoo

from pipelines import zoo
from pipelines.torchvision_resnet import _rename

REGION = "c-america"
CLASSES = 6
FILES = {  # file -> the network its keys are (OpenOOD's name of it)
    "basics": "resnet50", "logitnorm": "resnet50", "oe": "resnet50", "mixoe": "resnet50", "energy": "resnet50",
    "conf_branch": "conf_branch_net", "godin": "godin_net", "rotpred": "rot_net", "udg": "udg_net",
    "novel_branch": "extended_net", "extended": "extended_net", "arpl_netF": "resnet50_features",
    "arpl_criterion": "arpl_criterion", "opengan_DNet": "opengan_discriminator", "opengan_GNet": "opengan_generator",
}
WITH_FC = ["basics", "logitnorm", "oe", "mixoe", "energy", "conf_branch", "rotpred", "udg", "novel_branch", "extended"]


class Planted:
    """An object a pickle could carry beside tensors (what `weights_only` refuses)."""


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    folder = tmp_path_factory.mktemp("weights")
    return folder, make_zoo(folder, REGION, CLASSES)


def path_of(folder, stem: str):
    return folder / (f"{stem}_{REGION}.ckpt" if stem.startswith("opengan") else f"{stem}_{REGION}.pth")


def reference_forward(net, x):
    """(closed-set logits, pooled features) of a re-stated reference network."""
    with torch.no_grad():
        if hasattr(net, "backbone"):
            _, feats = net.backbone(x, return_feature=True)
            return net.fc(feats), feats
        return net(x, return_feature=True)


def test_names_say_method_part_and_region():
    assert zoo.parse_name("basics_c-america.pth") == zoo.ReleasedName("basics", "c-america")
    assert zoo.parse_name("/w/novel_branch_ne-america.pth") == zoo.ReleasedName("novel_branch", "ne-america")
    assert zoo.parse_name("conf_branch_w-europe.pth").network == "conf_branch_net"
    assert zoo.parse_name("arpl_criterion_c-america.pth") == zoo.ReleasedName("arpl", "c-america", "criterion")
    assert zoo.parse_name("opengan_DNet_c-america.ckpt").network == "opengan_discriminator"
    assert zoo.parse_name("extended_c-america.pth").network == "extended_net"
    for other in ("resnet50-0676ba61.pth", "arpl_c-america.pth", "basics_netF_c-america.pth", "basics_c-america.txt",
                  "c-america_resnet50_baseline.pth", "mcd_c-america.pth"):
        assert zoo.parse_name(other) is None, other
    assert zoo.ReleasedName("arpl", "c-america", "netF").sibling("criterion", "/w").name == \
        "arpl_criterion_c-america.pth"


@pytest.mark.parametrize("stem", sorted(FILES))
def test_each_file_is_identified_by_its_keys(released, stem):
    folder, _ = released
    state = zoo.read_state(path_of(folder, stem))
    assert zoo.identify_network(state) == FILES[stem]
    made = zoo.read_released(path_of(folder, stem))
    assert made.network == FILES[stem]
    if stem not in ("opengan_DNet", "opengan_GNet", "arpl_netF"):
        assert made.num_classes == CLASSES  # read from the tensors (fc, h.h, points)
    if made.backbone:
        assert zoo.resnet_architecture(made.backbone) == {"embedding_size": EMBEDDING, "hidden_sizes": list(WIDTHS),
                                                          "depths": list(DEPTHS), "layer_type": "bottleneck"}
        assert not any(k.startswith(("backbone.", "fc.")) for k in made.backbone)


def test_a_wrapped_network_keeps_its_heads(released):
    folder, nets = released
    made = zoo.read_released(path_of(folder, "extended"))
    assert set(made.heads) == {"fc", "fc_extended"}
    assert torch.equal(made.head("fc_extended")["weight"], nets["extended"].fc_extended.weight)
    godin = zoo.read_released(path_of(folder, "godin"))
    assert set(godin.heads) == {"h.h", "g.0", "g.1"} and godin.head("g.1")["running_var"].shape == (1,)


@pytest.mark.slow
@pytest.mark.parametrize("stem", WITH_FC)
def test_classifier_equals_the_reference_forward(released, stem):
    folder, nets = released
    clf = zoo.released_classifier(path_of(folder, stem))
    x = torch.from_numpy(np.random.default_rng(1).normal(size=(3, 3, 126, 126)).astype(np.float32))
    with torch.no_grad():
        logits, feats = clf(x)
    ref_logits, ref_feats = reference_forward(nets[stem], x)
    assert logits.shape == (3, CLASSES) and feats.shape == (3, WIDTHS[-1])
    np.testing.assert_allclose(feats.numpy(), ref_feats.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(logits.numpy(), ref_logits.numpy(), rtol=1e-4, atol=1e-5)
    assert clf.num_classes == CLASSES and clf.image_size == (126, 126)
    assert clf.record == {"transform": "reference", "image_size": 126, "pre_size": 128, "resample": "bilinear",
                          "orient": False}


def test_load_classifier_reads_a_file_or_a_folder(released):
    folder, _ = released
    assert zoo.load_classifier(path_of(folder, "basics")).num_classes == CLASSES


@pytest.mark.parametrize("stem", ["godin", "arpl_netF", "arpl_criterion", "opengan_DNet"])
def test_a_network_without_a_linear_head_is_no_classifier(released, stem):
    folder, _ = released
    with pytest.raises(zoo.ReleasedFileError) as err:
        zoo.released_classifier(path_of(folder, stem))
    assert str(path_of(folder, stem)) in str(err.value) and "\n" not in str(err.value)


def test_a_planted_pickle_is_refused_unread(tmp_path):
    path = tmp_path / "basics_c-america.pth"
    torch.save({"fc.weight": torch.zeros(2, 2), "note": Planted()}, path)
    with pytest.raises(zoo.ReleasedFileError, match="pickled objects other than tensors") as err:
        zoo.read_released(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("content", [[torch.zeros(2)], {"fc.weight": 3}, {}])
def test_a_file_that_is_no_state_dict_is_one_line(tmp_path, content):
    path = tmp_path / "basics_c-america.pth"
    torch.save(content, path)
    with pytest.raises(zoo.ReleasedFileError, match="not a state dict of named tensors"):
        zoo.read_state(path)
    (tmp_path / "x_c-america.pth").write_bytes(b"not a zip")  # torch reads bytes as a legacy pickle: refused
    with pytest.raises(zoo.ReleasedFileError, match="x_c-america.pth.* is refused"):
        zoo.read_state(tmp_path / "x_c-america.pth")


def test_a_key_mismatch_lists_missing_and_unexpected_keys_on_one_line(released, tmp_path):
    folder, _ = released
    state = zoo.read_state(path_of(folder, "conf_branch"))
    del state["backbone.layer2.1.conv2.weight"], state["confidence.bias"]
    state["backbone.layer5.0.conv1.weight"] = torch.zeros(1)
    state["module.extra"] = torch.zeros(1)
    path = tmp_path / "conf_branch_c-america.pth"
    torch.save(state, path)
    with pytest.raises(zoo.ReleasedFileError) as err:
        zoo.read_released(path)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"{path}: conf_branch_net: keys differ")
    assert re.search(r"missing \[.*'confidence\.bias'.*'backbone\.layer2\.1\.conv2\.weight'", text)
    assert re.search(r"unexpected \[.*'module\.extra'.*'backbone\.layer5\.0\.conv1\.weight'", text)


def test_a_name_that_says_another_network_than_the_keys(released, tmp_path):
    folder, _ = released
    path = tmp_path / "rotpred_c-america.pth"
    path.write_bytes(path_of(folder, "basics").read_bytes())  # resnet50 keys under a rot_net name
    with pytest.raises(zoo.ReleasedFileError, match=r"rot_net: keys differ.*missing \['rot_fc\.bias', "
                                                     r"'rot_fc\.weight', 'backbone\.conv1.*unexpected \['bn1\.bias'"):
        zoo.read_released(path)
    assert zoo.read_released(path, network="resnet50").network == "resnet50"  # the network given wins over the name
    renamed = tmp_path / "my_model.pth"  # no zoo name: the keys decide
    renamed.write_bytes(path_of(folder, "udg").read_bytes())
    assert zoo.read_released(renamed).network == "udg_net"


def test_a_wrong_head_width_or_class_count_names_the_tensor(released, tmp_path):
    folder, _ = released
    state = zoo.read_state(path_of(folder, "rotpred"))
    state["rot_fc.weight"] = torch.zeros(4, 7)
    torch.save(state, tmp_path / "rotpred_c-america.pth")
    with pytest.raises(zoo.ReleasedFileError, match=r"rot_fc.weight is \(4, 7\): it must read the backbone's 128"):
        zoo.read_released(tmp_path / "rotpred_c-america.pth")
    made = zoo.read_released(path_of(folder, "basics"))
    with pytest.raises(zoo.ReleasedFileError, match=r"6 classes \(fc.weight has 6 rows\) where the ID rows has 5"):
        zoo.check_class_count(made, 5, "the ID rows")
    other = zoo.released_classifier(path_of(folder, "basics"))
    other_model = zoo._resnet_model(zoo.resnet_architecture(made.backbone), CLASSES + 1)
    with pytest.raises(zoo.ReleasedFileError, match="6 classes where the run's classifier"):
        zoo.load_backbone(made, made.head("fc")["weight"], made.head("fc")["bias"], other_model)
    assert other.num_classes == CLASSES


def test_a_backbone_tensor_of_another_shape_is_named(released, tmp_path):
    folder, _ = released
    state = zoo.read_state(path_of(folder, "basics"))
    state["layer3.2.conv2.weight"] = torch.zeros(16, 16, 1, 1)
    torch.save(state, tmp_path / "basics_c-america.pth")
    with pytest.raises(zoo.ReleasedFileError, match=r"shapes differ.*layer3.2.conv2.weight \(16, 16, 1, 1\) \(expected "
                                                    r"\(16, 16, 3, 3\)\)"):
        zoo.read_released(tmp_path / "basics_c-america.pth")


def test_an_extended_head_must_be_wider_than_the_closed_set(released, tmp_path):
    folder, _ = released
    state = zoo.read_state(path_of(folder, "extended"))
    state["fc_extended.weight"], state["fc_extended.bias"] = state["fc.weight"], state["fc.bias"]
    torch.save(state, tmp_path / "extended_c-america.pth")
    with pytest.raises(zoo.ReleasedFileError, match="fc_extended has 6 classes, fc 6"):
        zoo.read_released(tmp_path / "extended_c-america.pth")


def test_arpl_criterion_holds_one_tensor_under_two_names(released, tmp_path):
    folder, _ = released
    state = zoo.read_state(path_of(folder, "arpl_criterion"))
    assert set(state) == {"points", "radius", "Dist.centers"}
    state["Dist.centers"] = state["Dist.centers"] + 1
    torch.save(state, tmp_path / "arpl_criterion_c-america.pth")
    with pytest.raises(zoo.ReleasedFileError, match="points and Dist.centers differ"):
        zoo.read_released(tmp_path / "arpl_criterion_c-america.pth")


def test_torchvision_names_invert_the_conversion(released):
    folder, _ = released
    made = zoo.read_released(path_of(folder, "basics"))
    model = zoo._resnet_model(zoo.resnet_architecture(made.backbone), CLASSES)
    for key in model.state_dict():
        name = zoo.torchvision_name(key)
        assert _rename(name) == key, (key, name)


def test_unknown_network_and_two_file_methods(released):
    folder, _ = released
    with pytest.raises(zoo.ReleasedFileError, match="unknown network 'resnet18'"):
        zoo.read_released(path_of(folder, "basics"), network="resnet18")
    with pytest.raises(zoo.ReleasedFileError, match="arpl_net is two files"):
        zoo.read_released(path_of(folder, "arpl_netF"), network="arpl_net")


def test_files_read_cover_both_parts_of_a_two_file_method(released):
    folder, _ = released
    netf, criterion = path_of(folder, "arpl_netF"), path_of(folder, "arpl_criterion")
    assert zoo.files_read(netf) == zoo.files_read(criterion) == [netf, criterion]
    assert zoo.files_read(path_of(folder, "opengan_GNet")) == [path_of(folder, "opengan_DNet")]
    assert zoo.files_read(path_of(folder, "udg")) == [path_of(folder, "udg")]


@pytest.mark.slow
def test_train_classifier_starts_from_a_released_basics_file(tmp_path, monkeypatch):
    """train_classifier's `model:` takes basics_<region>.pth (ResNet-50's real sizes, as its packaged config has them):
    the backbone loads, a head of another class count is the new one, a head of the same count is the file's."""
    from helpers.open_insect_zoo import ResNet50, randomise

    from pipelines.training.classify import build_classifier
    from pipelines.training.recipes import TrainConfig

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    net = randomise(ResNet50(3, widths=(256, 512, 1024, 2048), embedding=64), 5)
    path = tmp_path / f"basics_{REGION}.pth"
    torch.save(net.state_dict(), path)
    config = TrainConfig.from_dict({"id": str(tmp_path), "out": str(tmp_path / "out"), "model": str(path)})
    x = torch.from_numpy(np.random.default_rng(2).normal(size=(2, 3, 126, 126)).astype(np.float32))
    same = build_classifier(config, ["a", "b", "c"]).eval()
    with torch.no_grad():
        np.testing.assert_allclose(same(x)[0].numpy(), net(x).numpy(), rtol=1e-4, atol=1e-5)
    other = build_classifier(config, ["a", "b", "c", "d"]).eval()
    with torch.no_grad():
        np.testing.assert_allclose(other(x)[1].numpy(), net(x, return_feature=True)[1].numpy(), rtol=1e-4, atol=1e-5)
    assert other.num_classes == 4
