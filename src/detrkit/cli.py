"""The `detrkit` command line: run a detector on an image and draw what it finds."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

MODELS = ("nano", "small", "medium", "large")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="detrkit", description="RF-DETR detectors: predict (train: coming).")
    commands = parser.add_subparsers(dest="command", required=True)
    predict = commands.add_parser(
        "predict", help="detect objects in an image, print them and save a drawing",
        description="Detect objects in IMAGE; print one line per detection and save a PNG with boxes.")
    predict.add_argument("image", nargs="?", type=Path,
                         help="image file (default: a generated sample image of coloured shapes)")
    predict.add_argument("--model", choices=MODELS, default="nano", help="model size (default: nano)")
    source = predict.add_mutually_exclusive_group()
    source.add_argument("--weights", help="checkpoint file or published name (default: the model's "
                        "published COCO weights, downloaded once)")
    source.add_argument("--random-weights", action="store_true",
                        help="use random weights (no download; shows the pipeline, finds nothing real)")
    predict.add_argument("--threshold", type=float, default=0.5, help="minimum confidence (default 0.5)")
    predict.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    predict.add_argument("--save-image", type=Path, default=Path("predictions.png"),
                         help="where to write the drawing (default predictions.png)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return _predict(args)


def _predict(args: argparse.Namespace) -> int:
    from PIL import Image

    from detrkit.render import draw_detections, sample_image
    from detrkit.variants import VARIANTS

    if args.image is None:
        print("no IMAGE given: using a generated sample image")
        image = sample_image()
    else:
        from detrkit.datasets.images import read_image

        image = read_image(args.image)
    kwargs = {"device": args.device} if args.device else {}
    if args.random_weights:
        kwargs["pretrain_weights"] = None
    elif args.weights:
        kwargs["pretrain_weights"] = args.weights
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if args.random_weights else "default")
        model = VARIANTS[args.model](**kwargs)
    detections = model.predict(image, threshold=args.threshold)
    print(f"{len(detections)} detections at confidence > {args.threshold}")
    for box, score, name in zip(detections.xyxy, detections.confidence, detections.data["class_name"]):
        print(f"  {name:<16} {score:.3f}  [{', '.join(f'{v:.1f}' for v in box)}]")
    draw_detections(Image.fromarray(image) if not isinstance(image, Image.Image) else image,
                    detections).save(args.save_image)
    print(f"drawing saved to {args.save_image}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
