"""pytorch-ood 0.4 as a test oracle (`pip install --no-deps pytorch-ood==0.4.0`, .ci/parity_deps): its package
`__init__` imports torchvision (not installable beside CPU torch here), so a bare `pytorch_ood` package goes into
sys.modules and only `pytorch_ood.detector` (torch, numpy, scipy, sklearn) loads."""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import pytest


def pytorch_ood_detector() -> types.ModuleType:
    """`pytorch_ood.detector`, or a clean skip when pytorch-ood is not installed."""
    if "pytorch_ood" not in sys.modules:
        found = importlib.util.find_spec("pytorch_ood")
        if found is None:
            pytest.skip("pytorch-ood not installed (see .ci/parity_deps)")
        package = types.ModuleType("pytorch_ood")
        package.__path__ = list(found.submodule_search_locations)
        sys.modules["pytorch_ood"] = package
    return importlib.import_module("pytorch_ood.detector")
