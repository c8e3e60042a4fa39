"""The one table of display names: families, methods and OOD sets as the papers print them, each paper's method order,
and Open-Insects' categories.

Code names (the registry's, `detectors.available()`; the sets' `ood_set`) stay the keys everywhere; only rendered
tables and figures use these labels, and CSV files keep the code names. A name missing here is shown as it is: a
config's `label:` (which becomes the method name of its rows) is an explicit override and is printed as given.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from detectors.registry import FAMILY_LABELS, LISTING_ORDER, available, detector_class

METHOD_LABELS: dict[str, str] = {
    name: detector_class(name).label
    for family in LISTING_ORDER for name in available(family)}
"""The spelling of each registered method, its class's `label` (ShiftedBronzes' where the papers differ;
`Paper.spellings` override), post-hoc first, then VLM-based, generation-based and training-time."""

AUX_TRAINING: frozenset[str] = frozenset({"energy_oe", "extended", "mcd", "mixoe", "novel_branch", "oe", "udg"})
"""Training methods that train with auxiliary data (their objective's `uses_aux`; a test checks this against the
registry); the other training methods are training-time regularization."""

CATEGORIES: tuple[str, ...] = (FAMILY_LABELS["posthoc"], "Training-time regularization", "Training with auxiliary data")
"""Open-Insects' three method categories (its Tables 2 and 7), in order; the first is the post-hoc family's label."""


@dataclass(frozen=True)
class SetName:
    """An OOD set as printed: `short` (a table header, e.g. Open-Insects' `NM`) and `long` (captions and figures)."""

    short: str
    long: str


SET_NAMES: dict[str, SetName] = {
    # Open-Insects (what `scripts/make_splits.py` writes: `non_target` by default, `non_moth` under that name)
    "local": SetName("L", "local"), "non_local": SetName("NL", "non-local"),
    "non_target": SetName("NM", "non-moth"), "non_moth": SetName("NM", "non-moth"),
    # ShiftedBronzes
    "sketch_rubbing": SetName("Sketch & Rubbing", "sketch & rubbing"),
    "transferred_bronze": SetName("Transferred Bronze", "transferred bronze"),
    "transferred_container": SetName("Transferred Container", "transferred container"),
    "container": SetName("Container", "container"), "species": SetName("Species", "Species"),
    "imagenet_o": SetName("ImageNet-O", "ImageNet-O"), "inaturalist": SetName("iNaturalist", "iNaturalist"),
    "texture": SetName("Texture", "Texture"), "openimage_o": SetName("OpenImage-O", "OpenImage-O"),
}
"""The one mapping from `ood_set` names to the papers' set names."""


@dataclass(frozen=True)
class Paper:
    """One paper's conventions: its method spellings (over `METHOD_LABELS`), its method order and its family order."""

    name: str
    order: tuple[str, ...]
    families: tuple[str, ...]
    spellings: dict[str, str] = field(default_factory=dict)

    def label(self, method: str) -> str:
        return method_label(method, self)

    def sorted(self, methods: Iterable[str]) -> list[str]:
        """Distinct `methods` in the paper's order; methods it does not print (a config `label`, a newer method)
        follow in order of first appearance."""
        seen = list(dict.fromkeys(methods))
        rank = {m: i for i, m in enumerate(self.order)}
        known = sorted((m for m in seen if m in rank), key=rank.__getitem__)
        return known + [m for m in seen if m not in rank]


OPEN_INSECTS = Paper(
    "Open-Insects",
    order=("openmax", "msp", "tempscale", "odin", "mds", "mdsens", "rmds", "gram", "ebo", "opengan", "gradnorm",
           "react", "mls", "klm", "vim", "knn", "dice", "rankfeat", "ash", "she", "neco", "fdbd", "rp_msp", "rp_odin",
           "rp_ebo", "rp_gradnorm", "nci",
           "confbranch", "logitnorm", "arpl", "godin", "rotpred",
           "oe", "mcd", "udg", "mixoe", "energy_oe", "novel_branch", "extended"),
    families=("posthoc", "generative", "training"),
    spellings={"klm": "KLM", "vim": "VIM", "fdbd": "FDBD"})
"""Open-Insects' Tables 2/7: OpenOOD v1.5's post-hoc list (OpenGAN between EBO and GradNorm) then the Open-Insect code's
additions; training-time regularization; training with auxiliary data (OpenOOD's OE, MCD, UDG, MixOE, then Energy,
NovelBranch, Extended). Spellings as the paper and its code print them (KLM, VIM, FDBD)."""

SHIFTED_BRONZES = Paper(
    "ShiftedBronzes",
    order=("dice", "ebo", "gradnorm", "gram", "klm", "knn", "mds", "mls", "msp", "odin", "openmax", "react", "vim",
           "clipn", "locoop", "idlike", "diffguard", "opengan"),
    families=("posthoc", "clip", "generative"))
"""ShiftedBronzes' Tables 3 and 4 and Figure 5: the 13 post-hoc methods as its Section 5 lists them, then VLM-based
(CLIPN, LoCoOp, ID-like), then generation-based (DIFFGUARD, OpenGAN); families Post-hoc, VLM-based, Generation-based."""


REGION_NAMES: dict[str, str] = {"ne-america": "NE-America", "w-europe": "W-Europe", "c-america": "C-America"}
"""Open-Insects' regions as the paper prints them."""


def region_label(region: str) -> str:
    return REGION_NAMES.get(region, region)


def family_label(family: str) -> str:
    return FAMILY_LABELS.get(family, family)


def method_label(method: str, paper: Paper | None = None) -> str:
    """A method's display name (in `paper`'s spelling when given); a re-scored training row `base+rule` shows as
    `Base + Rule`; a name no paper prints (a config `label`) as it is."""
    if "+" in method:
        return " + ".join(method_label(part, paper) for part in method.split("+"))
    if paper is not None and method in paper.spellings:
        return paper.spellings[method]
    return METHOD_LABELS.get(method, method)


def set_label(ood_set: str) -> str:
    """An OOD set's display name (captions, figures); unknown sets as they are."""
    found = SET_NAMES.get(ood_set)
    return found.long if found else ood_set


def set_short(ood_set: str) -> str:
    """An OOD set's table header (`NM` for the non-moth set); unknown sets as they are."""
    found = SET_NAMES.get(ood_set)
    return found.short if found else ood_set


def group_label(group: str) -> str:
    """A group's display name: `hard` -> `Hard`."""
    return group[:1].upper() + group[1:]


def category(family: str, base: str = "", method: str = "") -> str | None:
    """Open-Insects' category of a row: post-hoc (OpenGAN, generation-based, is listed there as in the paper),
    training-time regularization or training with auxiliary data (by its training method `base`, else `method`);
    None for the other families."""
    if family in ("posthoc", "generative"):
        return CATEGORIES[0]
    if family == "training":
        return CATEGORIES[2] if (base or method) in AUX_TRAINING else CATEGORIES[1]
    return None


def unknown_methods(methods: Iterable[str]) -> list[str]:
    """Methods (parts of `base+rule` names included) that are no registered method: config labels, printed as given."""
    return [m for m in dict.fromkeys(methods) if any(part not in METHOD_LABELS for part in m.split("+"))]


__all__ = ["FAMILY_LABELS", "METHOD_LABELS", "AUX_TRAINING", "CATEGORIES", "SetName", "SET_NAMES", "Paper",
           "OPEN_INSECTS", "SHIFTED_BRONZES", "REGION_NAMES", "region_label", "family_label", "method_label",
           "set_label", "set_short", "group_label", "category", "unknown_methods"]
