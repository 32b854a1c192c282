"""The `detrkit` command line: the demo, training on a folder, scoring a checkpoint, prediction, export."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
import warnings
from pathlib import Path

MODELS = ("nano", "small", "medium", "large")


# modules that check what users give (settings, data sets, checkpoints): a ValueError raised there is the
# user's to fix, and is printed as one message; anywhere else it is a bug and keeps its traceback
_EDGES = ("detrkit.config", "detrkit.datasets", "detrkit.models.download", "detrkit.models.weights",
          "detrkit.training.resume", "detrkit.detr", "detrkit.cli")
INTERRUPTED_STATUS = 130  # what a shell reports for a program ended by Ctrl-C
USER_ERROR_STATUS = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="detrkit", description="Train and run RF-DETR detectors.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="show the Python traceback of an error (also: DETRKIT_DEBUG=1)")
    commands = _SubcommandsWith(common, parser.add_subparsers(dest="command", required=True))
    demo = commands.add_parser(
        "demo", help="generate a small shapes data set and train a detector on it (CPU, a few minutes)",
        description="Generate coloured shapes in COCO layout, train RFDETRNano from scratch at 224 px "
                    "(--task segment: RFDETRSegNano at 192 px, with masks; --task pose: a small "
                    "RFDETRKeypointPreview at 192 px, with the 4 corners of each shape as keypoints), print "
                    "the validation metrics and save a picture of predictions.")
    demo.add_argument("--task", choices=("detect", "segment", "pose"), default="detect",
                      help="detect: boxes (default); segment: boxes and instance masks; pose: boxes and keypoints")
    demo.add_argument("--output", type=Path, default=Path("detrkit-demo"), help="folder for everything")
    demo.add_argument("--device", default="cpu", help="torch device (default cpu)")
    demo.add_argument("--epochs", type=int, help="epochs (default 6; pose: 10)")
    _add_train_parser(commands)
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
    _add_export_parser(commands)
    _add_val_parser(commands)
    return parser


class _SubcommandsWith:
    """add_parser of the subcommands, each also taking the options of `common` (--debug)."""

    def __init__(self, common: argparse.ArgumentParser, commands: argparse._SubParsersAction) -> None:
        self.common, self.commands = common, commands

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        return self.commands.add_parser(name, parents=[self.common], **kwargs)


def _add_val_parser(commands: _SubcommandsWith) -> None:
    val = commands.add_parser(
        "val", help="score a checkpoint on a data set split, with per-class numbers, errors and plots",
        description="Rebuild the model saved in CHECKPOINT and score it on DATASET's split with the metric "
                    "training validation logs; print the table and write plots to OUTPUT/plots/.")
    val.add_argument("--checkpoint", required=True, type=Path, help="a .pth file written by train()")
    val.add_argument("--dataset", required=True, type=Path, help="dataset folder (format detected)")
    val.add_argument("--split", choices=("valid", "test", "train"), default="valid")
    val.add_argument("--batch-size", type=int, default=4)
    val.add_argument("--threshold", type=float, help="confidence for the confusion matrix and galleries "
                     "(default: the best F1's)")
    val.add_argument("--output", type=Path, default=Path("output"), help="folder for plots/ (default ./output)")
    val.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    val.add_argument("--no-plots", action="store_true", help="only print the numbers")


def _add_export_parser(commands: _SubcommandsWith) -> None:
    export = commands.add_parser(
        "export", help="export a checkpoint to ONNX or OpenVINO and check the file's accuracy",
        description="Rebuild the model saved in CHECKPOINT, export it, and compare the exported file with the "
                    "PyTorch model (on --dataset's validation images, else on fixed synthetic images); an export "
                    "that fails the check is not written. The table is printed and saved as <file>.check.json.")
    export.add_argument("--checkpoint", required=True, type=Path, help="a .pth file written by train()")
    export.add_argument("--format", choices=("onnx", "openvino"), default="onnx")
    export.add_argument("--output", type=Path, default=Path("output"), help="folder (default ./output)")
    export.add_argument("--batch-size", type=_export_batch, default=1, help="a fixed batch size or 'dynamic' (default 1)")
    export.add_argument("--opset", type=int, help="ONNX opset (default 17; at least 16)")
    export.add_argument("--half", action="store_true", help="fp16 network (post-processing stays fp32)")
    export.add_argument("--raw", action="store_true", help="export the heads' raw outputs, no post-processing")
    export.add_argument("--no-simplify", action="store_true", help="skip onnxslim")
    export.add_argument("--dataset", type=Path, help="check on this data set's validation split (adds mAP)")
    export.add_argument("--no-check", action="store_true", help="skip the accuracy check")
    export.add_argument("--quantize", choices=("int8",), help="int8 (ONNX: onnxruntime static quantization; "
                        "OpenVINO: NNCF), calibrated on --dataset's training images")
    export.add_argument("--sampling", choices=("grid_sample", "gather"), default="grid_sample",
                        help="deformable attention as ONNX GridSample (default) or, for runtimes without it, "
                             "as GatherElements")


def _add_train_parser(commands: _SubcommandsWith) -> None:
    train = commands.add_parser(
        "train", help="train on a COCO (Roboflow or plain) or YOLO folder",
        description="Train a detector on DATASET. Common options have flags; any other TrainConfig "
                    "or ModelConfig field can be set with --set NAME=VALUE (VALUE read as JSON when it parses).")
    train.add_argument("--dataset", required=True, type=Path, help="dataset folder (format detected)")
    train.add_argument("--model", choices=MODELS, default="nano", help="model size (default nano)")
    train.add_argument("--weights", help="starting checkpoint (default: published COCO weights); "
                       "'none' trains from scratch")
    train.add_argument("--epochs", type=int, default=100)
    train.add_argument("--batch-size", type=_batch_size, default=4,
                       help="images per step and device, or 'auto': the largest that fits on the GPU")
    train.add_argument("--grad-accum-steps", type=int, default=1)
    train.add_argument("--lr", type=float, default=1e-4)
    train.add_argument("--resolution", type=int, help="training resolution (default: the model's)")
    train.add_argument("--output", default="output", help="output folder (default ./output)")
    train.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    train.add_argument("--num-workers", type=int,
                       help="data loader workers (default: 2, or on CUDA one per CPU core up to 8)")
    train.add_argument("--resume", help="continue from a checkpoint: OUTPUT/last.ckpt (or 'last') restores "
                       "everything; a .pth file restores weights and callback states only")
    train.add_argument("--early-stopping", action="store_true",
                       help="stop when validation mAP stops improving (patience 10 epochs)")
    train.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                       help="any other TrainConfig or ModelConfig field, e.g. --set multi_scale=off")


def _batch_size(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}") from None


def _export_batch(text: str) -> int | str:
    if text == "dynamic":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'dynamic', got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user error (settings, data set, checkpoint, weights) prints one message
    and returns 2, unless --debug or DETRKIT_DEBUG=1 asks for its traceback; training stopped by
    Ctrl-C prints where it stopped and how to resume, and returns 130."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return _run(args, parser)
    except Exception as error:
        if _interrupted(error):  # Ctrl-C in training: the message says where and how to resume
            print(f"detrkit {args.command}: {error}", file=sys.stderr)
            return INTERRUPTED_STATUS
        if not is_user_error(error) or args.debug or os.environ.get("DETRKIT_DEBUG", "0") not in ("", "0"):
            raise
        print(f"detrkit {args.command}: error: {user_message(error, args.command)}", file=sys.stderr)
        return USER_ERROR_STATUS


def _interrupted(error: BaseException) -> bool:
    if "detrkit.training.callbacks.interrupt" not in sys.modules:  # not loaded: no training ran
        return False
    from detrkit.training.callbacks.interrupt import TrainingInterrupted

    return isinstance(error, TrainingInterrupted)


def is_user_error(error: BaseException) -> bool:
    """Whether `error` is something the user fixes: invalid settings, a missing or broken data set or
    checkpoint, unreachable weights, a feature not implemented; raised by detrkit's checks."""
    from pydantic import ValidationError

    from detrkit.models.download import WeightsDownloadError
    from detrkit.models.weights import CheckpointError

    if isinstance(error, (ValidationError, WeightsDownloadError, CheckpointError)):
        return True
    frames = traceback.extract_tb(error.__traceback__)
    module = _module_of(frames[-1].filename) if frames else ""
    if isinstance(error, (FileNotFoundError, NotImplementedError)):
        return module.startswith("detrkit")
    return isinstance(error, ValueError) and module.startswith(_EDGES)


def _module_of(filename: str) -> str:
    """detrkit.x.y for a file of this package, else ""."""
    path = Path(filename).resolve()
    root = Path(__file__).resolve().parent
    if root not in path.parents:
        return ""
    return ".".join(("detrkit", *path.relative_to(root).with_suffix("").parts))


def user_message(error: BaseException, command: str = "train") -> str:
    """The message of a user error, with what to do next in the command line's words."""
    from pydantic import ValidationError

    from detrkit.config.messages import describe_validation_error
    from detrkit.models.download import WeightsDownloadError

    if isinstance(error, WeightsDownloadError):
        go_on = error.how_to_go_on("cli")
        if command == "predict":
            go_on = go_on.replace("--weights none to train from scratch", "--random-weights to run without weights")
        return f"{error.problem}.\n{go_on}"
    if isinstance(error, ValidationError):
        lines = describe_validation_error(error)
        return "\n  ".join(["invalid settings:" if len(lines) > 1 else lines[0], *lines[int(len(lines) == 1):]]) + (
            f"\nSee `detrkit {command} --help` for the flags"
            + ("; --set NAME=VALUE takes any TrainConfig or ModelConfig field." if command == "train" else "."))
    frames = traceback.extract_tb(error.__traceback__)
    if command in ("train", "export") and frames and _module_of(frames[-1].filename).startswith("detrkit.datasets"):
        return f"{error}\nCheck the folder given with --dataset: a COCO (Roboflow or COCO 2017) or YOLO data set."
    return str(error)


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.command == "demo":
        from detrkit.demo import run_demo

        run_demo(args.output, args.device, args.epochs, task=args.task)
        return 0
    if args.command == "train":
        return _train(args, parser)
    if args.command == "export":
        return _export(args)
    if args.command == "val":
        return _val(args)
    return _predict(args)


def _export(args: argparse.Namespace) -> int:
    from detrkit.detr import from_checkpoint

    model = from_checkpoint(args.checkpoint, device="cpu")
    path = model.export(args.format, args.output, batch_size=args.batch_size, opset=args.opset, half=args.half, raw=args.raw,
                        simplify=not args.no_simplify, check=not args.no_check, dataset_dir=args.dataset,
                        quantize=args.quantize, sampling=args.sampling)
    print(f"exported to {path}")
    return 0


def _val(args: argparse.Namespace) -> int:
    import torch

    from detrkit.detr import from_checkpoint

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = from_checkpoint(args.checkpoint, device=device)
    result = model.evaluate(args.dataset, split=args.split, batch_size=args.batch_size, threshold=args.threshold,
                            output_dir=args.output, plots=not args.no_plots, progress_bar=None)
    print(result.summary())
    print("TIDE dAP@50: " + ", ".join(f"{kind} {value:.4f} ({result.errors.counts[kind]})"
                                      for kind, value in result.errors.delta.items()))
    if result.plots:
        print(f"plots written to {args.output / 'plots'}")
    return 0


def _train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from detrkit.variants import VARIANTS

    model_class = VARIANTS[args.model]
    model_kwargs: dict = {"device": args.device} if args.device else {}
    if args.weights:
        model_kwargs["pretrain_weights"] = None if args.weights.lower() == "none" else args.weights
    if args.resolution:
        model_kwargs["resolution"] = args.resolution
    train_settings, model_settings = _split_settings(_parse_settings(args.set, parser), parser)
    with warnings.catch_warnings():  # --weights none is a choice here; the start block says "from scratch"
        if args.weights and args.weights.lower() == "none":
            warnings.filterwarnings("ignore", message="pretrain_weights=None")
        model = model_class(**model_kwargs, **model_settings)
    options = dict(dataset_dir=str(args.dataset), output_dir=args.output, epochs=args.epochs,
                   batch_size=args.batch_size, grad_accum_steps=args.grad_accum_steps, lr=args.lr,
                   num_workers=args.num_workers, resume=args.resume, early_stopping=args.early_stopping)
    options.update(train_settings)
    model.train(**options)
    print(f"training finished; files are in {args.output} (best weights: checkpoint_best_total.pth, "
          f"full state for --resume: last.ckpt, losses and metrics by epoch: metrics.csv and plots/results.png)")
    return 0


def _split_settings(settings: dict, parser: argparse.ArgumentParser) -> tuple[dict, dict]:
    """--set values for train() (TrainConfig fields, Lightning Trainer arguments) and for the model
    (ModelConfig fields); an unknown name stops with the nearest known ones."""
    import difflib
    import inspect

    import pytorch_lightning as pl

    from detrkit.config import KeypointTrainConfig, ModelConfig, SegmentationTrainConfig, TrainConfig

    train_names = set(TrainConfig.legacy_keys) | set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
    for config_class in (TrainConfig, SegmentationTrainConfig, KeypointTrainConfig):
        train_names |= set(config_class.model_fields)
    model_names = set(ModelConfig.model_fields) - train_names
    for name in settings:
        if name not in train_names | model_names:
            close = difflib.get_close_matches(name, sorted(train_names | model_names), n=3)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            parser.exit(USER_ERROR_STATUS, f"detrkit train: error: --set {name}=...: unknown setting{hint}. "
                        f"--set takes TrainConfig and ModelConfig fields; `detrkit train --help` lists the flags.\n")
    model = {name: value for name, value in settings.items() if name in model_names}
    return {name: value for name, value in settings.items() if name not in model}, model


def _parse_settings(pairs: list[str], parser: argparse.ArgumentParser) -> dict:
    settings = {}
    for pair in pairs:
        name, separator, value = pair.partition("=")
        if not separator:
            parser.exit(USER_ERROR_STATUS, f"detrkit train: error: --set expects NAME=VALUE, got {pair!r}\n")
        try:
            settings[name] = json.loads(value)
        except json.JSONDecodeError:
            settings[name] = value
    return settings


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
