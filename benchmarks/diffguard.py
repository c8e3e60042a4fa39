"""DIFFGUARD speed on tiny random models (CPU or GPU), each case a ratio against a baseline in the same process:

- batching: our batched reconstruction (inversion with per-sample early stop and guided denoising, both batched) at
  each batch size vs the official design (DiffGuard's code inverts a batch, then runs the guided denoising one image
  at a time), with a batch-1 loop beside them. Every round runs the cases in a fresh random order and each case
  reports min / median / max over the rounds: a fixed order (the loop always first, after the largest batch of
  the round before) makes the loop and "batched 1", the same code, differ by 1.35x;
- early_stop_features: the DISTS early-stop rule with the input's VGG features computed once per batch vs at every
  inversion step (random VGG16/DISTS weights; the rule alone and the whole inversion);
- gradcam: the latent back-end's prediction taken from the Grad-CAM pass vs a separate prediction pass.

Results go to benchmarks/diffguard.json.

    python -m benchmarks.diffguard                       # 16 images, batch sizes 1,4,8,16, 100 steps
    python -m benchmarks.diffguard --steps 50 --images 8 --batch-sizes 1,8 --sections batching
"""
from __future__ import annotations

import argparse
import platform
import random
import statistics
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import torch

import detectors
from benchmarks.cases.diffguard import (
    SmallConvClassifier,
    bench_early_stop_features,
    bench_gradcam_single_pass,
    contrast_ramp_images,
    timed_seconds,
)
from detectors.generative.diffguard import resize_center_crop
from detectors.generative.distances import DISTS, vgg16_features
from detectors.generative.pixel_backend import ClassifierGuidance, denoise_from, invert_with_early_stop
from pipelines.classifier import ImageClassifier, find_head
from pipelines.io import atomic_write_json
from pipelines.runtime import item_generator, seed_everything
from pipelines.tiny import save_tiny_pixel_unet

SECTIONS = ("batching", "early_stop_features", "gradcam")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", type=lambda t: t.split(","), default=list(SECTIONS))
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--loop-images", type=int, default=None, help="images in the batch-1 loop (default: all)")
    parser.add_argument("--batch-sizes", type=lambda t: [int(v) for v in t.split(",")], default=[1, 4, 8, 16])
    parser.add_argument("--order-seed", type=int, default=0, help="seed of the per-round case order")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--max-inversion-steps", type=int, default=90)
    parser.add_argument("--early-stop-psnr", type=float, default=15.0,
                        help="dB on [0,1] images; 15 makes the tiny random model's inversions stop at different steps")
    parser.add_argument("--dists-threshold", type=float, default=0.95,
                        help="early-stop similarity threshold of the DISTS section (random weights: stops at 2-5 steps "
                             "of 10 on the tiny model)")
    parser.add_argument("--gradcam-size", type=int, default=128, help="image side of the Grad-CAM section (ResNet)")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds, cases in a random order in each")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 avoids oversubscription)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", default=Path(__file__).with_suffix(".json"))
    return parser.parse_args(argv)


def random_dists_files(folder: Path) -> list[Path]:
    """torchvision-layout VGG16 weights and DISTS alpha/beta, random (nothing can be downloaded here)."""
    torch.manual_seed(0)
    torch.save({f"features.{k}": v for k, v in vgg16_features().state_dict().items()}, folder / "vgg16.pt")
    channels = sum(DISTS.channels)
    torch.save({"alpha": torch.rand(1, channels, 1, 1), "beta": torch.rand(1, channels, 1, 1)}, folder / "dists.pt")
    return [folder / "vgg16.pt", folder / "dists.pt"]


def official_reconstruct(det, x01: torch.Tensor, labels: torch.Tensor, seeds: list[int]) -> torch.Tensor:
    """The official design on one batch: DDIM inversion of the batch (per-sample early stop), then classifier-guided
    denoising (and the unguided reference) one image at a time; the same steps as `DiffGuard.reconstruct_pixel`."""
    model = det.pixel_model()
    x0 = (2 * x01 - 1).to(det.device)
    p = det.params
    latents, stop = invert_with_early_stop(model, x0, p["max_inversion_steps"], det.stop_rule(x0))
    start = (stop + 1 + p["denoise_offset"]).clamp(max=model.steps - 1)
    out = []
    for i in range(len(x0)):
        guidance = ClassifierGuidance(model, det.classifier, labels[i:i + 1].repeat(2), [item_generator(seeds[i])] * 2,
                                      p["guidance_scale"], p["n_crops"], int(p["crop_size"] or det.classifier_size()),
                                      p["clean_grad"], p["guidance_grad"])
        guided = torch.tensor([True, False], device=x0.device)
        out.append(denoise_from(model, latents[i:i + 1].repeat(2, 1, 1, 1), start[i:i + 1].repeat(2), guidance, guided))
    return ((torch.cat([o[:1] for o in out]).clamp(-1, 1) + 1) / 2).detach()


def bench_batching(det, images: list, batch_sizes: list[int], loop_images: int | None, rounds: int,
                   order_seed: int) -> dict:
    """Seconds of each case per round, cases in a fresh random order every round (after one untimed warm-up pass
    of every case); ratios are images/s over the official design at the largest batch size, per round."""
    device = det.device
    size = int(det.pixel_model().unet.config.sample_size)
    x01 = resize_center_crop(images, size, size).to(device)
    labels, seeds, n = det.predict(x01), list(range(len(images))), len(images)
    stops = [int(det.reconstruct_pixel(x01[i:i + 1], labels[i:i + 1], seeds[i:i + 1])[2]) for i in range(n)]
    step = {"loop": lambda b, s: det.reconstruct_pixel(x01[s], labels[s], seeds[s]),
            "batched": lambda b, s: det.reconstruct_pixel(x01[s], labels[s], seeds[s]),
            "official": lambda b, s: official_reconstruct(det, x01[s], labels[s], seeds[s])}
    cases = ([("loop", 1, loop_images or n)] + [("batched", b, n) for b in batch_sizes]
             + [("official", b, n) for b in batch_sizes if b > 1])
    run = lambda case: [step[case[0]](case[1], slice(i, min(i + case[1], case[2]))) for i in range(0, case[2], case[1])]  # noqa: E731
    order, times = random.Random(order_seed), {case: [] for case in cases}
    for round_ in range(rounds + 1):  # round 0: warm-up, not kept
        for case in order.sample(cases, len(cases)):
            seconds = timed_seconds(lambda case=case: run(case), device)
            if round_:
                times[case].append(seconds)
                print(f"[diffguard] round {round_}: {case[0]} {case[1]:3d}: {case[2] / seconds:.3f} img/s", flush=True)
    reference = ("official", max(b for b in batch_sizes if b > 1), n) if max(batch_sizes) > 1 else cases[0]
    rows = []
    for case in cases:
        ratios = [(case[2] / t) / (n / r) for t, r in zip(times[case], times[reference])]  # same round
        rows.append(dict(mode=case[0], batch_size=case[1], images=case[2], seconds=times[case],
                         images_per_s=case[2] / min(times[case]), ratio_min=min(ratios),
                         ratio_median=statistics.median(ratios), ratio_max=max(ratios)))
    head = slice(0, min(2, n))  # the official design computes the same guided reconstructions
    same = float((official_reconstruct(det, x01[head], labels[head], seeds[head])
                  - det.reconstruct_pixel(x01[head], labels[head], seeds[head])[0]).abs().max())
    return dict(reference=f"official design, batch {reference[1]} (batched inversion, batch-1 guided denoising)",
                rounds=rounds, order_seed=order_seed, stop_steps=stops, official_max_abs_diff=same, cases=rows)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    torch.set_num_threads(args.threads)
    seed_everything(0)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    classifier = ImageClassifier.from_module(SmallConvClassifier().eval(), image_size=32).to(device).eval()
    images = contrast_ramp_images(args.images, 32)
    result: dict = dict(benchmark="diffguard", created=datetime.now(UTC).isoformat(timespec="seconds"),
                        device=str(device), cpu=platform.processor() or platform.machine(), threads=args.threads,
                        torch=torch.__version__, model="tiny pixel UNet (pipelines.tiny.save_tiny_pixel_unet), 32 px",
                        rounds=args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        unet = save_tiny_pixel_unet(Path(tmp) / "unet")
        common = dict(classifier=classifier, unet_id=str(unet), precision="fp32", distance="ssim")
        if "batching" in args.sections:
            det = detectors.build("diffguard", steps=args.steps, max_inversion_steps=args.max_inversion_steps,
                                  early_stop_psnr=args.early_stop_psnr, early_stop_similarity=None, **common)
            batching = bench_batching(det, images, args.batch_sizes, args.loop_images, args.rounds, args.order_seed)
            batching.update(steps=args.steps, max_inversion_steps=args.max_inversion_steps,
                            early_stop_psnr=args.early_stop_psnr, n_crops=det.params["n_crops"])
            result["batching"] = batching
            print("\n| run | batch | img/s (best) | x vs official, min / median / max |\n|---|---|---|---|")
            for case in batching["cases"]:
                spread = " / ".join(f"{case[k]:.2f}" for k in ("ratio_min", "ratio_median", "ratio_max"))
                print(f"| {case['mode']} | {case['batch_size']} | {case['images_per_s']:.3f} | {spread} |")
        if "early_stop_features" in args.sections:
            det = detectors.build("diffguard", steps=10, max_inversion_steps=9, early_stop_psnr=None,
                                  early_stop_similarity="dists", early_stop_similarity_threshold=args.dists_threshold,
                                  perceptual_weights=random_dists_files(Path(tmp)), **common)
            result["early_stop_features"] = bench_early_stop_features(det, images, args.rounds)
            result["early_stop_features"].update(steps=10, max_inversion_steps=9, threshold=args.dists_threshold)
    if "gradcam" in args.sections:
        from transformers import ResNetConfig, ResNetForImageClassification

        config = ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], num_labels=10)
        resnet = ResNetForImageClassification(config).eval()
        size = args.gradcam_size
        clf = ImageClassifier(resnet, find_head(resnet, 10), image_size=(size, size), kind="hf").to(device).eval()
        x01 = torch.rand(8, 3, size, size, generator=torch.Generator().manual_seed(0)).to(device)
        result["gradcam"] = bench_gradcam_single_pass(clf, x01, args.rounds)
        result["gradcam"]["model"] = "transformers ResNet (hidden 32-256, 1 layer a stage), random weights"
    print("\n| speed-up | baseline | ratio |\n|---|---|---|")
    if "early_stop_features" in result:
        r = result["early_stop_features"]
        print(f"| DISTS early-stop rule, input features once | features at every step | {r['rule_ratio']:.2f} |")
        print(f"| whole inversion with that rule | same | {r['inversion_ratio']:.2f} |")
    if "gradcam" in result:
        print("| Grad-CAM + prediction in one pass | prediction pass + Grad-CAM pass | "
              f"{result['gradcam']['ratio']:.2f} |")
    atomic_write_json(args.out, result)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
