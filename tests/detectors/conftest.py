"""Fixtures of the runner tests: the embedded digits data and a tiny trained transformers classifier."""
import pytest
import torch

from pipelines.classifier import ImageClassifier
from pipelines.data import read_manifest
from pipelines.toydata import tiny_digit_classifier_config, write_digits


def train_digits_classifier(id_dir, folder, seed: int = 0, epochs: int = 3):
    """A tiny ResNet (real config, sizes shrunk) fine-tuned on digits 0-5 and saved to `folder`."""
    from transformers import ResNetForImageClassification

    from pipelines.training import finetune

    torch.manual_seed(seed)
    config, processor = tiny_digit_classifier_config()
    ResNetForImageClassification(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    clf = ImageClassifier.from_pretrained(folder)
    finetune(clf, read_manifest(id_dir).select(split="train"), epochs=epochs, lr=3e-3, batch_size=32, warmup_epochs=0,
             seed=seed)
    clf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def digits(tmp_path_factory):
    """(ID manifest folder, OOD manifest folder, classifier folder)."""
    root = tmp_path_factory.mktemp("digits")
    id_dir, ood_dir = write_digits(root, n_textures=40)
    return id_dir, ood_dir, train_digits_classifier(id_dir, root / "clf")
