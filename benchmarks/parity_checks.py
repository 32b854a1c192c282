#!/usr/bin/env python3
"""Static side-by-side checks of detrkit against the reference, for hunting a learning difference.

    PYTHONPATH=src REF/bin/python benchmarks/parity_checks.py [--out result.json]

Runs with the reference's interpreter (rfdetr importable) and prints JSON with:
  init          state-dict tensors of freshly built Nano models whose mean or spread differ by more
                than four times what two draws of one distribution would (names and shapes must match)
  param_groups  parameters whose (lr, weight_decay) differ between the two optimisers' groups
  pipeline      per-sample training transforms on the same 200 images (4 passes): mean pixel spread and
                gradient, boxes per image (+- SE), box size and aspect, the share of sliver boxes (a side
                under 3% of the image) and empty samples, for both branches and for the resize branch
                alone; detrkit's two recipes beside the reference's torchvision and default
                (Albumentations) pipelines (issue 26: they should agree within noise)
  alignment     box edges against the edges of a white rectangle after the transform (pixels)
  first_loss    detrkit's criterion on an untrained model, over each side's own training batches
  step          one training-mode forward, loss and backward of the reference's weights in both
                packages, on the same batch at the multi-scale sides (issue 26: learning differed with
                multi-scale on): the loss difference and the largest gradient difference relative to
                the gradient's scale, over parameters whose reference gradient is not ~0 (the key
                biases' gradients are 0 up to rounding: softmax ignores them)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import warnings
from pathlib import Path

import torch
from torchvision import tv_tensors

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import learning_arms  # noqa: E402  (the reference-side adapters)
from task_learning import TASKS  # noqa: E402


def quiet_build(factory, **kwargs):
    real, sys.stdout = sys.stdout, sys.stderr
    try:
        torch.manual_seed(0)
        return factory(**kwargs)
    finally:
        sys.stdout = real


def init_differences(ours: dict, theirs: dict) -> list[str]:
    if ours.keys() != theirs.keys():
        return [f"keys differ: {sorted(set(ours) ^ set(theirs))[:10]}"]
    found = []
    for name in sorted(ours):
        a, b = ours[name].float(), theirs[name].float()
        if a.shape != b.shape:
            found.append(f"{name}: shape {tuple(a.shape)} vs {tuple(b.shape)}")
        elif a.numel() > 1:
            # two independent draws of one distribution differ by about spread * sqrt(2 / n) in
            # the mean and spread * sqrt(1 / n) in the spread: flag what lies 4 such units apart
            spread, unit = max(a.std().item(), b.std().item(), 1e-6), a.numel() ** -0.5
            if (abs(a.mean().item() - b.mean().item()) > 4 * spread * unit * 2**0.5 + 1e-6
                    or abs(a.std().item() - b.std().item()) > 4 * spread * unit + 1e-6):
                found.append(f"{name}: mean {a.mean().item():+.3g}/{b.mean().item():+.3g} "
                             f"std {a.std().item():.3g}/{b.std().item():.3g}")
    return found


def group_differences(ours_model, reference, reference_config) -> dict:
    import types

    from rfdetr.training.param_groups import get_param_dict

    from detrkit.config import TrainConfig
    from detrkit.training.optim import parameter_groups

    train, module = reference_config, reference.model.model
    namespace = types.SimpleNamespace(**train.model_dump(),
                                      out_feature_indexes=reference.model_config.out_feature_indexes)
    names = {id(p): n for n, p in module.named_parameters()}
    theirs = {names[id(p)]: (g.get("lr", train.lr), g.get("weight_decay", train.weight_decay))
              for g in get_param_dict(namespace, module) for p in g["params"]}
    config = TrainConfig(dataset_dir=".")
    groups = parameter_groups(ours_model.model.named_parameters(), lr=config.lr, lr_encoder=config.lr_encoder,
                              weight_decay=config.weight_decay, layer_decay=config.lr_vit_layer_decay,
                              component_decay=config.lr_component_decay,
                              num_encoder_layers=ours_model.model_config.out_feature_indexes[-1] + 1)
    names = {id(p): n for n, p in ours_model.model.named_parameters()}
    ours = {names[id(p)]: (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
    shared = set(ours) & set(theirs)
    return {"compared": len(shared), "only_reference": sorted(set(theirs) - shared),
            "only_detrkit": sorted(set(ours) - shared),
            "differ": [f"{n}: {ours[n]} vs {theirs[n]}" for n in sorted(shared) if ours[n] != theirs[n]]}


def pipeline_statistics(root: Path, transform, repeats: int = 4) -> dict:
    from detrkit.datasets.coco import CocoDetection

    torch.manual_seed(0)
    random.seed(0)
    data = CocoDetection(root / "train" / "_annotations.coco.json", root / "train", transform)
    spreads, gradients, counts, boxes, empty = [], [], [], [], 0
    for _ in range(repeats):
        for index in range(len(data)):
            pixels, target = data[index]
            spreads.append(pixels.std().item())
            gradients.append((pixels.diff(dim=-1).abs().mean() + pixels.diff(dim=-2).abs().mean()).item())
            counts.append(len(target.boxes))
            empty += len(target.boxes) == 0
            boxes.append(target.boxes[:, 2:])
    sides = torch.cat(boxes)
    return {"samples": len(counts), "pixel_std": round(statistics.mean(spreads), 4),
            "pixel_gradient": round(statistics.mean(gradients), 4),
            "boxes_per_image": round(statistics.mean(counts), 3),
            "boxes_per_image_se": round(statistics.stdev(counts) / len(counts) ** 0.5, 3), "empty": empty,
            "box_w": round(sides[:, 0].mean().item(), 4), "box_h": round(sides[:, 1].mean().item(), 4),
            "aspect_quartiles": (sides[:, 0] / sides[:, 1]).quantile(torch.tensor([0.25, 0.5, 0.75])).round(
                decimals=3).tolist(),
            "sliver_share": round((sides.min(1).values < 0.03).float().mean().item(), 4)}


def pipelines(largest: list[int]) -> dict:
    """name -> (jitter -> per-sample training transform): detrkit's recipes and the reference's."""
    from rfdetr.datasets.aug_configs import AUG_CONFIG

    from detrkit.datasets.transforms import build_train_transform

    return {"detrkit_default": lambda jitter: build_train_transform(largest, True, jitter),
            "detrkit_torchvision": lambda jitter: build_train_transform(largest, True, jitter, recipe="torchvision"),
            "reference_torchvision": lambda jitter: learning_arms.ReferenceTransform(largest, jitter),
            "reference_albumentations": lambda jitter: learning_arms.ReferenceTransform(largest, jitter, AUG_CONFIG)}


def alignment_error(transform, samples: int = 300) -> dict:
    """Signed and absolute error of (x0, y0, x1, y1) against the rectangle's visible edges."""
    from detrkit.datasets.images import IMAGENET_MEAN, IMAGENET_STD

    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    draw = random.Random(0)
    torch.manual_seed(0)
    errors = []
    for _ in range(samples):
        x0, y0 = draw.randint(20, 150), draw.randint(20, 110)
        x1, y1 = x0 + draw.randint(30, 120), y0 + draw.randint(30, 100)
        image = torch.zeros(3, 240, 320, dtype=torch.uint8)
        image[:, y0:y1, x0:x1] = 255
        box = tv_tensors.BoundingBoxes(torch.tensor([[x0, y0, x1, y1]], dtype=torch.float32), format="XYXY",
                                       canvas_size=(240, 320))
        pixels, out = transform(tv_tensors.Image(image), {"boxes": box, "labels": torch.tensor([1]),
                                                           "area": torch.tensor([float((x1 - x0) * (y1 - y0))])})
        boxes = out["boxes"].as_subclass(torch.Tensor)
        bright = (pixels * std + mean).mean(0) > 0.5
        if len(boxes) == 0 or not bright.any():
            continue
        ys, xs = torch.nonzero(bright, as_tuple=True)
        seen = torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=torch.float32)
        errors.append(boxes[0] - seen)
    stacked = torch.stack(errors)
    return {"samples": len(errors), "signed": stacked.mean(0).round(decimals=3).tolist(),
            "absolute": stacked.abs().mean(0).round(decimals=3).tolist()}


def first_losses(model, train_config, loader, scales: list[int], batches: int) -> dict:
    from detrkit.datasets.transforms import batch_scale, resize_batch
    from detrkit.losses.criterion import build_criterion

    criterion = build_criterion(model.model_config, train_config)
    detector = model.model.train()
    totals = []
    for step, batch in enumerate(loader):
        if step == batches:
            break
        batch = resize_batch(batch, batch_scale(step, scales))  # the step's multi-scale side, as in training
        with torch.no_grad():
            totals.append(float(criterion(detector(batch.pixels, batch.padding), batch.targets,
                                          groups=detector.groups).total))
    return {"batches": len(totals), "mean": round(statistics.mean(totals), 4),
            "standard_error": round(statistics.stdev(totals) / len(totals) ** 0.5, 4)}


def step_differences(ours, reference, sizes: list[int]) -> dict:
    from rfdetr.models import build_criterion_from_config
    from rfdetr.utilities.tensors import NestedTensor

    from detrkit.losses.criterion import build_criterion
    from detrkit.structures import Target

    theirs, detector = reference.model.model.train(), ours.model.train()
    detector.load_state_dict(theirs.state_dict())
    their_criterion, _ = build_criterion_from_config(reference.model_config,
                                                     reference.get_train_config(dataset_dir="."))
    criterion = build_criterion(ours.model_config, ours.get_train_config(dataset_dir="."))
    targets = [{"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.2]])},
               {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])}]
    generator, result = torch.Generator().manual_seed(3), {}
    for side in sizes:
        pixels = torch.randn(2, 3, side, side, generator=generator)
        theirs.zero_grad()
        losses = their_criterion(theirs(NestedTensor(pixels, torch.zeros(2, side, side, dtype=torch.bool)), targets),
                                 targets)
        their_loss = sum(losses[k] * their_criterion.weight_dict[k] for k in losses if k in their_criterion.weight_dict)
        their_loss.backward()
        detector.zero_grad()
        ours_targets = [Target(boxes=t["boxes"], labels=t["labels"], image_id=i, orig_size=(side, side),
                               size=(side, side)) for i, t in enumerate(targets)]
        loss = criterion(detector(pixels, None), ours_targets, groups=detector.groups).total
        loss.backward()
        their_grads = {name: p.grad for name, p in theirs.named_parameters() if p.grad is not None}
        gaps = {}
        for name, p in detector.named_parameters():
            scale = their_grads[name].abs().max() if name in their_grads else 0.0
            if p.grad is not None and scale > 1e-9:
                gaps[name] = ((p.grad - their_grads[name]).abs().max() / scale).item()
        worst = max(gaps, key=gaps.get)
        result[side] = {"loss": float(loss), "loss_difference": float(loss) - float(their_loss),
                        "parameters_compared": len(gaps), "largest_relative_gradient_difference": gaps[worst],
                        "at": worst}
    return result


CHECKS = ("init", "param_groups", "pipeline", "alignment", "first_loss", "step")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=25)
    parser.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS), help="run only these")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    from rfdetr import RFDETRNano as Reference
    from rfdetr.config import TrainConfig as ReferenceTrainConfig

    from detrkit import RFDETRNano
    from detrkit.config import TrainConfig
    from detrkit.datasets.synthetic import make_synthetic_dataset
    from detrkit.datasets.transforms import multi_scale_sizes
    from detrkit.training.datamodule import RFDETRDataModule

    wanted, result = set(args.checks), {}
    if wanted & {"init", "param_groups", "first_loss"}:
        reference = quiet_build(Reference, pretrain_weights=None, device="cpu", resolution=320, num_classes=3)
        ours = quiet_build(RFDETRNano, pretrain_weights=None, device="cpu", resolution=320, num_classes=3)
    if "init" in wanted:
        result["init"] = init_differences(ours.model.state_dict(), reference.model.model.state_dict())
    if "param_groups" in wanted:
        result["param_groups"] = group_differences(ours, reference, ReferenceTrainConfig(dataset_dir="."))
    root = Path(os.environ.get("TMPDIR", "/tmp")) / "detrkit-parity"
    if wanted & {"pipeline", "first_loss"}:
        data = make_synthetic_dataset(root / "data", num_train=200, num_valid=50, seed=0)
    made = pipelines([max(multi_scale_sizes(320, 32, True))])
    if "pipeline" in wanted:
        result["pipeline"] = {f"{name}_{branch}": pipeline_statistics(data, make(jitter))
                              for branch, jitter in (("both_branches", True), ("resize_only", False))
                              for name, make in made.items()}
    if "alignment" in wanted:
        result["alignment"] = {name: alignment_error(make(True)) for name, make in made.items()}
    if "first_loss" in wanted:
        config = TrainConfig(dataset_dir=str(data), output_dir=str(root / "out"), batch_size=4, num_workers=2, seed=0)
        datamodule = RFDETRDataModule(ours.model_config, config)
        datamodule.setup("fit")
        scales = multi_scale_sizes(320, 32, True)
        result["first_loss"] = {
            "detrkit_batches": first_losses(ours, config, datamodule.train_dataloader(), scales, args.batches),
            "reference_batches": first_losses(ours, config, learning_arms.reference_train_loader(datamodule),
                                              scales, args.batches)}
    if "step" in wanted:
        tiny = dict(TASKS["detect"]["kwargs"], device="cpu", num_classes=3)  # task_learning.py's small Nano
        block = tiny["patch_size"] * tiny["num_windows"]
        result["step"] = step_differences(quiet_build(RFDETRNano, **tiny), quiet_build(Reference, **tiny),
                                          multi_scale_sizes(tiny["resolution"], block, True))
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
