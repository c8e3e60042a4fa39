"""DiffPath against its official code's computation: the DDIM path run by OpenAI's own diffusion code (the
`guided-diffusion-sdk` package, improved-diffusion's successor: the same respacing, cosine schedule, learned-range
sigma split and reverse DDIM step as `clear-nus/diffpath`'s `improved_diffusion/`) with OpenAI's own UNet holding the
same random weights, eps re-derived as `gaussian_diffusion.py:553-556` and the statistics as
`save_train_statistics.py:77-98` (numpy, float32); a 2-step path by hand in float64 from the closed-form cosine
schedule; the density models against scikit-learn as `eval_6d.py` / `eval_1d.py` run it and the KDE by its formula."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from detectors import ImageSet, build
from detectors.generative.diffpath import (
    IMPROVED_64_UNCOND,
    STATISTICS,
    VARIANTS,
    DiffPath,
    alphas_cumprod,
    ddim_timesteps,
)
from detectors.generative.guided_diffusion import build_unet, convert_state_dict, load_pixel_unet, resolve_flags

script_util = pytest.importorskip("guided_diffusion.script_util", reason="pip install --no-deps guided-diffusion-sdk")
from guided_diffusion.gaussian_diffusion import _extract_into_tensor  # noqa: E402

# The official model's flags at a tiny size: 16 px, width 32 (attention at the same downsampling factors, 4 heads
# at every width, so head sizes differ between levels as in the real model), one res block per level; the real
# 4000-step cosine schedule.
TINY = {**IMPROVED_64_UNCOND, "image_size": 16, "num_channels": 32, "num_res_blocks": 1,
        "attention_resolutions": "4,2"}
STEPS = 4  # ddim4 of 4000: stride 1000


def official_unet(flags, empty: bool = False):
    kwargs = {k: v for k, v in resolve_flags(flags).items() if k not in ("diffusion_steps", "noise_schedule")}
    if not empty:
        return script_util.create_model(**kwargs)
    from accelerate import init_empty_weights

    with init_empty_weights():
        return script_util.create_model(**kwargs)


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """OpenAI's UNet with random weights (its zero-initialised output convolutions too), and its checkpoint file."""
    torch.manual_seed(0)
    model = official_unet(TINY).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05) if p.dim() > 1 else p.normal_(0, 0.5)
    path = tmp_path_factory.mktemp("diffpath") / "tiny_improved64.pt"
    torch.save(model.state_dict(), path)
    return model, path


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(3)
    return [Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)) for _ in range(7)]


def detector(path, **params) -> DiffPath:
    """DiffPath on the tiny checkpoint through the real loading code (fp32 on the CPU)."""
    defaults = dict(unet_id=str(path), adm_flags=TINY, steps=STEPS, batch_size=3, n_jobs=1, device="cpu")
    return build("diffpath", **{**defaults, **params})


def official_statistics(model, images, steps: int = STEPS) -> np.ndarray:
    """The official inversion and statistics on the same pixels (x in [-1, 1], as its Normalize(0.5, 0.5))."""
    diffusion = script_util.create_gaussian_diffusion(steps=TINY["diffusion_steps"], learn_sigma=True,
                                                      noise_schedule="cosine", rescale_timesteps=True,
                                                      timestep_respacing=f"ddim{steps}")
    x = torch.from_numpy(np.stack([np.asarray(i, dtype=np.float32) / 255 for i in images])).permute(0, 3, 1, 2)
    x = (x - 0.5) / 0.5
    all_eps = []
    with torch.no_grad():
        for i in range(diffusion.num_timesteps):
            t = torch.tensor([i] * len(x))
            out = diffusion.ddim_reverse_sample(model, x, t, clip_denoised=True)
            all_eps.append((_extract_into_tensor(diffusion.sqrt_recip_alphas_cumprod, t, x.shape) * x
                            - out["pred_xstart"])
                           / _extract_into_tensor(diffusion.sqrt_recipm1_alphas_cumprod, t, x.shape))
            x = out["sample"]
    n_ddim_steps = len(diffusion.betas)
    eps = np.array([e.numpy() for e in all_eps]).transpose(1, 0, 2, 3, 4)
    eps_diff = np.diff(eps, axis=1) * n_ddim_steps
    axes = (1, 2, 3, 4)
    columns = []
    for v in (eps, eps_diff):
        columns += [v.sum(axes), np.abs(v).sum(axes), (v**2).sum(axes), np.sqrt((v**2).sum(axes)), (v**3).sum(axes),
                    np.cbrt((v**3).sum(axes))]
    return np.stack(columns, axis=1).astype(np.float64)


def cancelling_scale(expected: np.ndarray) -> np.ndarray:
    """Each column's largest magnitude, the signed sums of eps and deps/dt measured against their sums of |.|: float32
    sums cancel there, so the CPU's kernels move them by a share of the magnitudes, not of the result."""
    scale = np.abs(expected).max(0)
    for signed, magnitude in (("eps_sum", "eps_sum_abs"), ("deps_dt", "deps_dt_abs")):
        scale[STATISTICS.index(signed)] = scale[STATISTICS.index(magnitude)]
    return scale


def assert_statistics_close(got, expected, rtol=2e-4, scale=None):
    """Column by column, relative to the column's largest magnitude (float32 sums on the official side), or to
    `scale` [12] (the sums of magnitudes, for signed sums that cancel)."""
    assert got.shape == expected.shape
    for j, name in enumerate(STATISTICS):
        size = np.abs(expected[:, j]).max() if scale is None else scale[j]
        np.testing.assert_allclose(got[:, j], expected[:, j], rtol=0, atol=rtol * size, err_msg=name)


def test_schedule_and_respacing_are_improved_diffusions():
    from guided_diffusion import gaussian_diffusion as gd
    from guided_diffusion.respace import space_timesteps

    for schedule, steps in (("cosine", 4000), ("linear", 1000), ("cosine", 100)):
        expected = np.cumprod(1 - gd.get_named_beta_schedule(schedule, steps))
        np.testing.assert_allclose(alphas_cumprod(schedule, steps), expected, rtol=1e-12, atol=0)
    for total, steps in ((4000, 10), (1000, 30), (1000, 100), (4000, 4), (50, 50)):
        assert list(ddim_timesteps(total, steps)) == sorted(space_timesteps(total, f"ddim{steps}"))
    assert list(ddim_timesteps(1000, 30)[:3]) == [0, 34, 68]  # not 1000 // 30 = 33
    with pytest.raises(ValueError, match="cannot create exactly 7"):
        ddim_timesteps(10, 7)


def test_real_model_layout_is_the_official_checkpoints():
    """The ImageNet 64x64 model's flags build OpenAI's layout: every tensor maps, shapes equal."""
    theirs = official_unet(IMPROVED_64_UNCOND, empty=True)
    ours = build_unet(IMPROVED_64_UNCOND, empty=True)
    converted = {k: tuple(v.shape) for k, v in convert_state_dict(theirs.state_dict(), IMPROVED_64_UNCOND).items()}
    assert converted == {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert sum(p.numel() for p in theirs.parameters()) == sum(p.numel() for p in ours.parameters())
    heads = {m.heads for name, m in ours.named_modules() if name.endswith(("attentions.0", "attentions.1"))}
    assert heads == {4}  # improved-diffusion's num_heads at every width (head sizes 96 and 128)


def test_path_statistics_equal_the_official_computation(official, images):
    model, path = official
    got = detector(path).statistics(ImageSet(images=images))
    expected = official_statistics(model, images)
    assert got.shape == (7, 12)
    assert np.abs(expected[:, STATISTICS.index("deps_dt_sq")]).min() > 1.0  # a path that moves
    assert_statistics_close(got, expected, scale=cancelling_scale(expected))


def test_two_step_path_by_hand_in_float64(official, images):
    """steps=2 of T=4000: timesteps 0 and 2000, abar(t) = f(t + 1) / f(0) with f(s) = cos^2((s / T + 0.008) / 1.008
    * pi / 2) (no beta reaches the 0.999 cap there); the model sees t * 1000 / T. The path in float64 (a float64
    model) against the formulas written out; the float32 detector within float32 error of it."""
    from detectors.generative.diffpath import DDIMPath, to_model_input

    _, path = official
    det = detector(path, steps=2)
    x = to_model_input(images[:3], 16).double()
    unet = load_pixel_unet(path, TINY).double()
    got = DDIMPath.build(unet, 2, 4000, "cosine", dtype=torch.float64).statistics(x)
    f = lambda s: math.cos((s / 4000 + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
    abar = [f(1) / f(0), f(2001) / f(0), 0.0]
    eps = []
    for k, t in enumerate((0.0, 500.0)):
        with torch.no_grad():
            e = unet(x, torch.full((3,), t, dtype=torch.float64)).sample[:, :3]
        x0 = ((x - math.sqrt(1 - abar[k]) * e) / math.sqrt(abar[k])).clamp(-1, 1)
        eps.append((x - math.sqrt(abar[k]) * x0) / math.sqrt(1 - abar[k]))
        x = x0 * math.sqrt(abar[k + 1]) + math.sqrt(1 - abar[k + 1]) * eps[-1]
    e = torch.stack(eps, 1).flatten(2).numpy()  # [B, 2, D]
    d = (e[:, 1] - e[:, 0]) * 2
    e = e.reshape(len(e), -1)
    expected = np.stack([e.sum(1), np.abs(e).sum(1), (e**2).sum(1), np.sqrt((e**2).sum(1)), (e**3).sum(1),
                         np.cbrt((e**3).sum(1)), d.sum(1), np.abs(d).sum(1), (d**2).sum(1), np.sqrt((d**2).sum(1)),
                         (d**3).sum(1), np.cbrt((d**3).sum(1))], axis=1)
    np.testing.assert_allclose(got, expected, rtol=1e-10)
    assert_statistics_close(det.statistics(ImageSet(images=images[:3])), expected, rtol=1e-3)


def test_6d_mixture_is_sklearns_search_and_refit(official, images):
    """eval_6d.py:38-59 on the same statistics: StandardScaler + GaussianMixture, GridSearchCV, best refit."""
    from sklearn.mixture import GaussianMixture
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    _, path = official
    grid = {"gmm_components": [1, 2], "cv_folds": 3, "seed": 7}
    det = detector(path, **grid).fit(ImageSet(images=images))
    test = ImageSet(images=images[:4])
    scores = det.score(test)
    columns = [STATISTICS.index(s) for s in VARIANTS["6d"]]
    train = det.statistics(ImageSet(images=images))[:, columns]
    clf = Pipeline([("scaler", StandardScaler()), ("GMM", GaussianMixture(random_state=7))])
    search = GridSearchCV(clf, {"GMM__n_components": [1, 2], "GMM__covariance_type": ["full", "tied", "diag",
                                                                                      "spherical"],
                                "GMM__max_iter": [200]}, cv=3).fit(train)
    best = clf.set_params(**search.best_params_).fit(train)
    np.testing.assert_allclose(det.score_statistics(det.statistics(ImageSet(images=images)))[:4],
                               best.score_samples(train[:4]), rtol=1e-10)
    np.testing.assert_allclose(scores, best.score_samples(train[:4]), rtol=1e-4)  # re-batched: float32 rounding
    chosen = det.resolved_params()
    assert (chosen["gmm_components"], chosen["gmm_covariance_types"]) == (
        [search.best_params_["GMM__n_components"]], [search.best_params_["GMM__covariance_type"]])


def test_1d_kde_is_the_gaussian_kernel_density_by_formula(official, images):
    """eval_1d.py: log of the mean Gaussian kernel (bandwidth 5) at the root summed squared rate of change."""
    _, path = official
    det = detector(path, variant="1d").fit(ImageSet(images=images[:5]))
    stats = det.statistics(ImageSet(images=images))
    train, query = stats[:5, STATISTICS.index("deps_dt_sq_sqrt")], stats[:, STATISTICS.index("deps_dt_sq_sqrt")]
    h = 5.0
    z = -((query[:, None] - train[None, :]) ** 2) / (2 * h * h)
    m = z.max(1, keepdims=True)
    expected = m[:, 0] + np.log(np.exp(z - m).mean(1)) - 0.5 * np.log(2 * np.pi * h * h)
    np.testing.assert_allclose(det.score(ImageSet(images=images)), expected, rtol=1e-9)
    np.testing.assert_allclose(det.score_statistics(stats), expected, rtol=1e-9)


def test_edges_empty_single_and_uneven_batches(official, images, tmp_path):
    _, path = official
    det = detector(path, variant="1d")
    with pytest.raises(RuntimeError, match="not fitted"):
        det.score(ImageSet(images=images[:1]))
    with pytest.raises(ValueError, match="needs ID training images"):
        det.fit(ImageSet(images=[]))
    det.fit(ImageSet(images=images[:4]))
    empty = det.score(ImageSet(images=[]))
    assert empty.shape == (0,) and empty.dtype == np.float64
    whole = detector(path, batch_size=7).statistics(ImageSet(images=images))
    uneven = detector(path, batch_size=5).statistics(ImageSet(images=images))  # batches of 5 and 2
    single = detector(path).statistics(ImageSet(images=images[6:]))
    assert_statistics_close(uneven, whole, rtol=1e-3)  # float32 convolutions round by batch shape
    assert_statistics_close(single, whole[6:], rtol=1e-3, scale=np.abs(whole).max(0))
    # a saved detector scores as the fitted one (the density refitted from the saved training features)
    six = detector(path, gmm_components=[1, 2], cv_folds=2).fit(ImageSet(images=images[:4]))
    six.save_pretrained(tmp_path / "six")
    again = DiffPath.from_pretrained(tmp_path / "six", unet_id=str(path), n_jobs=1, device="cpu", batch_size=3)
    np.testing.assert_allclose(again.score(ImageSet(images=images)), six.score(ImageSet(images=images)), rtol=1e-12)
    with pytest.raises(ValueError, match="does not exist"):
        DiffPath.check_files({"unet_id": str(tmp_path / "absent.pt")})
    with pytest.raises(ValueError, match="imagenet64_uncond_100M_1500K.pt"):
        DiffPath.check_files({"unet_id": None})
    DiffPath.check_files({"unet_id": str(path)})


def test_the_references_row_names_the_class_facts():
    """docs/references.md's `diffpath` row names every reference file the class names, and the paper's label."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "references.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `diffpath` |")]
    assert len(rows) == 1
    files = [token.strip(",") for token in DiffPath.reference_code.split() if token.endswith((".py", ".py,"))]
    assert files and all(f in rows[0] for f in files)
    assert DiffPath.reference_code.split()[0] in rows[0] and "6f92000" in rows[0]
    assert DiffPath.label == "DiffPath" and "NeurIPS 2024" in DiffPath.paper


def test_statistics_equal_the_official_codes_golden(tmp_path):
    """tests/helpers/diffpath_official.py ran the official code (its model, loop and statistic lines) at the official
    10 steps; the same seeded weights, rebuilt from OpenAI's UNet's tensor names and shapes, through our loader."""
    import json
    from pathlib import Path

    from helpers.diffpath_official import GOLDEN, images, seeded_state

    golden = json.loads(Path(GOLDEN).read_text())
    official_flags = golden["flags"]
    flags = {k: official_flags[k] for k in ("image_size", "num_channels", "num_res_blocks", "num_heads",
                                           "num_heads_upsample", "attention_resolutions", "dropout", "learn_sigma",
                                           "class_cond", "use_scale_shift_norm", "diffusion_steps", "noise_schedule")}
    shapes = {k: tuple(v.shape) for k, v in official_unet(flags, empty=True).state_dict().items()}
    assert sum(math.prod(s) for s in shapes.values()) == golden["n_parameters"]
    torch.save(seeded_state(shapes), tmp_path / "tiny.pt")
    pictures = [Image.fromarray(a) for a in images()]
    got = detector(tmp_path / "tiny.pt", adm_flags=flags, steps=golden["steps"]).statistics(ImageSet(images=pictures))
    expected = np.stack([golden["statistics"][name] for name in STATISTICS], axis=1)
    assert_statistics_close(got, expected, rtol=1e-4, scale=cancelling_scale(expected))  # float32 sums there
    assert np.abs(expected[:, STATISTICS.index("deps_dt_sq")]).min() > 1.0  # a path that moves
