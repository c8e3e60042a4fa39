"""DIFFGUARD batched per-sample early stop vs the batch-1 loop of the original design (tiny random models, CPU or GPU).

Both run the same detector code on the same tiny pixel UNet and classifier in one process; the ratio is images/s of
the batched run over images/s of the loop. Results go to benchmarks/diffguard.json.

    python scripts/bench_diffguard.py                       # 16 images, batch sizes 1,4,8,16, 100 steps
    python scripts/bench_diffguard.py --steps 50 --images 8 --batch-sizes 1,8
"""
from __future__ import annotations

import argparse
import platform
import tempfile
from datetime import datetime, timezone

import torch

import detectors
from detectors.generative.bench import SmallConvClassifier, bench_early_stop_batching, contrast_ramp_images
from pipelines.classifier import ImageClassifier
from pipelines.io import atomic_write_json
from pipelines.runtime import seed_everything
from pipelines.tiny import save_tiny_pixel_unet


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--loop-images", type=int, default=None, help="images in the batch-1 loop (default: all)")
    parser.add_argument("--batch-sizes", type=lambda t: [int(v) for v in t.split(",")], default=[1, 4, 8, 16])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--max-inversion-steps", type=int, default=90)
    parser.add_argument("--early-stop-psnr", type=float, default=15.0,
                        help="dB on [0,1] images; 15 makes the tiny random model's inversions stop at different steps")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved timing rounds; each case keeps its fastest")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 avoids oversubscription)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", default="benchmarks/diffguard.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    seed_everything(0)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    classifier = ImageClassifier.from_module(SmallConvClassifier().eval(), image_size=32).to(device).eval()
    with tempfile.TemporaryDirectory() as tmp:
        det = detectors.build("diffguard", classifier=classifier, unet_id=save_tiny_pixel_unet(tmp), steps=args.steps,
                              max_inversion_steps=args.max_inversion_steps, early_stop_psnr=args.early_stop_psnr,
                              early_stop_similarity=None, distance="ssim", precision="fp32")
        det.pixel_model()
    result = bench_early_stop_batching(det, contrast_ramp_images(args.images, 32), args.batch_sizes, args.loop_images,
                                       args.rounds)
    result.update(benchmark="diffguard", created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  device=str(device), cpu=platform.processor() or platform.machine(), threads=args.threads,
                  torch=torch.__version__, model="tiny pixel UNet (pipelines.tiny.save_tiny_pixel_unet), 32 px",
                  steps=args.steps, max_inversion_steps=args.max_inversion_steps, early_stop_psnr=args.early_stop_psnr,
                  n_crops=det.n_crops)
    print("\n| run | batch | img/s | x vs batch-1 loop |\n|---|---|---|---|")
    for case in result["cases"]:
        print(f"| {case['mode']} | {case['batch_size']} | {case['images_per_s']:.3f} | {case['ratio']:.2f} |")
    atomic_write_json(args.out, result)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
