"""The one table of display names: families and methods as the papers print them, and Open-Insects' categories.

Code names (the registry's, `detectors.available()`) stay the keys everywhere; only rendered tables and figures use
these labels. A name missing here is shown as it is.
"""
from __future__ import annotations

from detectors.registry import FAMILY_LABELS


METHOD_LABELS: dict[str, str] = {
    "ash": "ASH", "dice": "DICE", "ebo": "EBO", "fdbd": "fDBD", "gen": "GEN", "gradnorm": "GradNorm", "gram": "Gram",
    "klm": "KL-Matching", "knn": "KNN", "mds": "MDS", "mdsens": "MDSEns", "mls": "MLS", "msp": "MSP", "nci": "NCI",
    "neco": "NECO", "odin": "ODIN", "openmax": "OpenMax", "rankfeat": "RankFeat", "react": "ReAct", "rmds": "RMDS",
    "rp_ebo": "RP-EBO", "rp_gradnorm": "RP-GradNorm", "rp_msp": "RP-MSP", "rp_odin": "RP-ODIN", "she": "SHE",
    "tempscale": "TempScale", "vim": "ViM", "clipn": "CLIPN", "glmcm": "GL-MCM", "idlike": "ID-like",
    "locoop": "LoCoOp", "mcm": "MCM", "neglabel": "NegLabel", "diffguard": "DIFFGUARD", "opengan": "OpenGAN",
    "arpl": "ARPL", "confbranch": "ConfBranch", "energy_oe": "Energy", "extended": "Extended", "godin": "G-ODIN",
    "logitnorm": "LogitNorm", "mcd": "MCD", "mixoe": "MixOE", "novel_branch": "NovelBranch", "oe": "OE",
    "rotpred": "RotPred", "udg": "UDG",
}
"""The papers' spelling of each registered method."""

AUX_TRAINING: frozenset[str] = frozenset({"energy_oe", "extended", "mcd", "mixoe", "novel_branch", "oe", "udg"})
"""Training methods that train with auxiliary data (their objective's `uses_aux`; a test checks this against the
registry); the other training methods are training-time regularization."""

CATEGORIES: tuple[str, ...] = ("Post-hoc", "Training-time regularization", "Training with auxiliary data")
"""Open-Insects' three method categories (its Tables 2 and 7), in order."""


def family_label(family: str) -> str:
    return FAMILY_LABELS.get(family, family)


def method_label(method: str) -> str:
    """A method's display name; a re-scored training row `base+rule` shows as `Base + Rule`."""
    if "+" in method:
        return " + ".join(method_label(part) for part in method.split("+"))
    return METHOD_LABELS.get(method, method)


def category(family: str, base: str = "", method: str = "") -> str | None:
    """Open-Insects' category of a row: post-hoc, training-time regularization or training with auxiliary data (by its
    training method `base`, else `method`); None for the other families."""
    if family == "posthoc":
        return CATEGORIES[0]
    if family == "training":
        return CATEGORIES[2] if (base or method) in AUX_TRAINING else CATEGORIES[1]
    return None


__all__ = ["FAMILY_LABELS", "METHOD_LABELS", "AUX_TRAINING", "CATEGORIES", "family_label", "method_label", "category"]
