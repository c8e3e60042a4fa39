"""Temperature scaling: MSP of z / T with T fitted on ID-validation NLL (Guo et al., ICML 2017)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from scipy.optimize import minimize

from detectors.base import Detector, FeatureSet
from detectors.posthoc.common import labels_of, logits_of, logsumexp, softmax
from detectors.registry import register_detector
from pipelines.params import Params, param

LOG_T_BOUNDS = (np.log(1e-3), np.log(1e3))


def temperature_nll(log_t: Any, logits: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Mean NLL of softmax(z / T) and its derivative with respect to log T (float64; `log_t` a scalar or [1] array)."""
    s = float(np.exp(-np.asarray(log_t, dtype=np.float64).reshape(-1)[0]))  # 1 / T
    scaled = s * logits
    true = logits[np.arange(len(labels)), labels]
    nll = np.mean(logsumexp(scaled, axis=1) - s * true)
    d_nll_ds = np.mean(np.sum(softmax(scaled) * logits, axis=1) - true)
    return float(nll), float(-s * d_nll_ds)


def fit_temperature(logits: np.ndarray, labels: np.ndarray, init: float = 1.5) -> float:
    """T minimising the mean NLL, by L-BFGS-B on log T within [1e-3, 1e3] (starts at OpenOOD's 1.5)."""
    logits = np.asarray(logits, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    if labels.min() < 0 or labels.max() >= logits.shape[1]:
        raise ValueError(f"tempscale: labels must lie in [0, {logits.shape[1]}), got [{labels.min()}, {labels.max()}]")
    result = minimize(temperature_nll, x0=np.array([np.log(init)]), args=(logits, labels), jac=True, method="L-BFGS-B",
                      bounds=[LOG_T_BOUNDS], options={"ftol": 1e-15, "gtol": 1e-10, "maxiter": 200})
    return float(np.exp(result.x[0]))


def fit_temperature_lbfgs(logits: np.ndarray, labels: np.ndarray, init: float = 1.5, lr: float = 0.01,
                          max_iter: int = 50) -> float:
    """OpenOOD v1.5's fit (temp_scaling_postprocessor.py): one `torch.optim.LBFGS([T], lr=0.01, max_iter=50)` step on
    the mean cross-entropy of z / T from T = 1.5, in float32 as there; it stops short of the exact optimum."""
    z = torch.as_tensor(np.asarray(logits), dtype=torch.float32)
    y = torch.as_tensor(np.asarray(labels), dtype=torch.long)
    if y.min() < 0 or y.max() >= z.shape[1]:
        raise ValueError(f"tempscale: labels must lie in [0, {z.shape[1]}), got [{int(y.min())}, {int(y.max())}]")
    temperature = torch.nn.Parameter(torch.full((1,), float(init)))
    optimizer = torch.optim.LBFGS([temperature], lr=lr, max_iter=max_iter)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(z / temperature, y)
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(temperature.detach()[0])


@register_detector("tempscale")
class TempScale(Detector):
    """Max softmax of z / T; `temperature=None` fits T on ID-val (else ID-train) NLL, a number fixes it.

    `output="prob"` returns p = max_k softmax(z / T)_k (OpenOOD). `output="logodds"` returns log(p / (1 - p)) computed
    as -logsumexp_{k != top}((z_k - z_top) / T): the same ranking and metrics, but no float64 saturation at p = 1, which
    otherwise ties every confident sample when the fitted T is small (e.g. a perfectly separated validation set).
    """

    label = "TempScale"
    aliases = {"TemperatureScaling": "pytorch-ood's", "temperature_scaling": "OpenOOD's", "temp_scaling": "OpenOOD's"}
    reference_code = "OpenOOD openood/postprocessors/temp_scaling_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"logits"})
    paper = "Guo et al., On Calibration of Modern Neural Networks, ICML 2017"
    protocol_defaults = {"exact": {"fit": "exact"}}  # the exact NLL optimum instead of OpenOOD's under-converged LBFGS

    @dataclass(frozen=True)
    class Params(Params):
        temperature: float | None = param(None, "a fixed temperature T; None fits it on ID validation NLL", gt=0)
        output: Literal["logodds", "prob"] = param("logodds",
                                                   "score as the log-odds of the max softmax, or the probability")
        fit: Literal["lbfgs", "exact"] = param("lbfgs",
                                               "T fitting: OpenOOD's torch LBFGS (lr 0.01, 50 iterations from 1.5) "
                                                        "or the exact NLL optimum")

    fit_inputs = frozenset({"id_val"})

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.fitted_temperature: float | None = None

    @property
    def effective_temperature(self) -> float:
        """The fixed temperature, else the fitted one."""
        if self.params["temperature"] is not None:
            return float(self.params["temperature"])
        if self.fitted_temperature is None:
            raise RuntimeError("tempscale: temperature=None means 'fit it'; call fit(id_train, id_val=...) first")
        return self.fitted_temperature

    def resolved_params(self) -> dict[str, Any]:
        fitted = self.params["temperature"] is None and self.fitted_temperature is not None
        return {"temperature": self.fitted_temperature} if fitted else {}

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        if self.params["temperature"] is not None:
            return
        data = id_val if id_val is not None else id_train
        if not isinstance(data, FeatureSet):
            raise TypeError("tempscale: fitting T needs a FeatureSet with logits and labels, got "
                            f"{type(data).__name__}")
        fit = fit_temperature if self.params["fit"] == "exact" else fit_temperature_lbfgs
        self.fitted_temperature = fit(logits_of(data, self.name), labels_of(data, self.name))

    def _score(self, batch: Any) -> np.ndarray:
        scaled = logits_of(batch, self.name) / self.effective_temperature
        if self.params["output"] == "prob":
            return softmax(scaled).max(axis=1)
        if self.params["output"] != "logodds":
            raise ValueError(f"tempscale: output must be 'prob' or 'logodds', got {self.params['output']!r}")
        top = scaled.argmax(axis=1)
        rest = scaled - scaled[np.arange(len(scaled)), top][:, None]
        rest[np.arange(len(scaled)), top] = -np.inf
        return -logsumexp(rest, axis=1)

    def state(self) -> dict[str, np.ndarray]:
        out = super().state()
        if self.fitted_temperature is not None:
            out["temperature"] = np.array([self.fitted_temperature], dtype=np.float64)
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        if "temperature" in state:
            self.fitted_temperature = float(state["temperature"][0])
