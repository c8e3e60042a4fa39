"""Helpers of the runner tests (imported by name: pytest puts this folder on sys.path)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def eval_config(digits: tuple[Path, Path, Path], out: Path, **extra: Any) -> dict[str, Any]:
    """A runner config on the digits data: ID digits 0-5, OOD digits 6-9 / sketch / texture."""
    id_dir, ood_dir, model = digits
    return {"model": str(model), "id": str(id_dir), "ood": [{"manifest": str(ood_dir)}], "out": str(out), **extra}


def evaluate_main():
    """`main` of scripts/evaluate.py, loaded from its file (scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("evaluate_script", Path(__file__).parents[2] / "scripts" / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
