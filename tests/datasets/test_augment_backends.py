"""The augmentation backend registry, its config fields, errors before training, and the presets."""

from __future__ import annotations

import sys

import pytest
import torch
from pydantic import ValidationError
from torchvision import tv_tensors

from detrkit.config import AugmentationBackend, TrainConfig
from detrkit.datasets import aug_configs
from detrkit.datasets.augmentation import (BACKENDS, AlbumentationsAugmentation, KorniaAugmentation,
                                           TorchvisionAugmentation, build_augmentation, resolve_backend)
from detrkit.datasets.transforms import RandomClippedCrop, RandomSquareCrop
from detrkit.structures import Batch, Target


def config(**kwargs) -> TrainConfig:
    return TrainConfig(dataset_dir=None, **kwargs)


def sample(height: int = 48, width: int = 64):
    image = tv_tensors.Image(torch.randint(0, 256, (3, height, width), dtype=torch.uint8))
    boxes = tv_tensors.BoundingBoxes(torch.tensor([[4.0, 6.0, 30.0, 40.0]]), format="XYXY", canvas_size=(height, width))
    return image, {"boxes": boxes, "labels": torch.tensor([1]), "area": torch.tensor([900.0])}


@pytest.mark.parametrize("given, stored", [
    ("cpu", "cpu"), ("auto", "auto"), ("torchvision", "torchvision"), ("albumentations", "albumentations"),
    ("kornia", "kornia"), ("gpu", "kornia"), ("tv", "torchvision"), ("albu", "albumentations"), ("GPU", "kornia"),
])
def test_backend_names_and_aliases(given, stored):
    assert config(augmentation_backend=given).augmentation_backend == stored


def test_config_rejects_unknown_backends_and_out_of_range_mixing():
    with pytest.raises(ValidationError, match="augmentation_backend"):
        config(augmentation_backend="opencv")
    for field, value in (("mosaic", 1.5), ("mixup", -0.1), ("close_mosaic_epochs", -1)):
        with pytest.raises(ValidationError, match=field):
            config(**{field: value})
    defaults = config()
    assert (defaults.aug_config, defaults.augmentation_backend, defaults.mosaic, defaults.mixup,
            defaults.close_mosaic_epochs) == (None, "cpu", 0.0, 0.0, 0)


def test_registry_covers_every_backend_name_but_auto():
    assert set(BACKENDS) | {"auto"} == {member.value for member in AugmentationBackend}


@pytest.mark.parametrize("name, aug_config, cuda, expected", [
    ("kornia", None, True, "torchvision"),  # no aug_config: the default pipeline whatever the backend
    ("albumentations", {}, False, "torchvision"),  # {}: no augmentation
    ("auto", {"HorizontalFlip": {}}, True, "kornia"),
    ("auto", {"HorizontalFlip": {}}, False, "albumentations"),
    ("cpu", {"HorizontalFlip": {}}, True, "cpu"),
    ("torchvision", {"HorizontalFlip": {}}, True, "torchvision"),
])
def test_resolve_backend(name, aug_config, cuda, expected):
    assert resolve_backend(name, aug_config, cuda) == expected


def test_auto_on_a_cpu_run_picks_albumentations():
    pytest.importorskip("albumentations")
    built = build_augmentation(config(aug_config={"HorizontalFlip": {"p": 0.5}}, augmentation_backend="auto",
                                      accelerator="cpu"))
    assert isinstance(built, AlbumentationsAugmentation)


def test_default_and_empty_configs_use_torchvision():
    default = build_augmentation(config())
    assert isinstance(default, TorchvisionAugmentation) and default.flip_p == 0.5 and default.batch_augment() is None
    assert build_augmentation(config(aug_config={})).flip_p == 0.0
    with pytest.warns(UserWarning, match="ignored"):
        build_augmentation(config(aug_config={"VerticalFlip": {}}, augmentation_backend="torchvision"))


@pytest.mark.parametrize("backend, aug_config, recipe", [
    ("cpu", None, "default"), ("auto", None, "default"), ("albumentations", None, "default"),
    ("torchvision", None, "torchvision"), ("torchvision", {}, "torchvision"),
])
def test_the_built_in_recipe_follows_the_named_backend_not_the_installed_packages(monkeypatch, backend, aug_config,
                                                                                  recipe):
    for package in ("albumentations", "kornia"):
        monkeypatch.setitem(sys.modules, package, None)  # as if not installed: import fails
    built = build_augmentation(config(aug_config=aug_config, augmentation_backend=backend, accelerator="cpu"))
    assert isinstance(built, TorchvisionAugmentation) and built.recipe == recipe
    windows = [type(t) for t in built.train_transform([32], True, True).transforms[0].transforms[1].transforms]
    assert (RandomClippedCrop if recipe == "default" else RandomSquareCrop) in windows


def test_augmentation_backends_resize_by_the_default_recipe():
    pytest.importorskip("albumentations")
    built = build_augmentation(config(aug_config={"HorizontalFlip": {"p": 0.5}}, augmentation_backend="albumentations"))
    assert built.recipe == "default"
    windows = [type(t) for t in built.train_transform([32], True, True).resize.transforms[1].transforms]
    assert RandomClippedCrop in windows


def test_empty_aug_config_only_resizes_and_normalises():
    torch.manual_seed(0)
    image, target = sample()
    transform = build_augmentation(config(aug_config={})).train_transform([32], True, False)
    for _ in range(5):  # never flipped
        pixels, out = transform(image, target)
        assert pixels.shape == (3, 32, 32) and pixels.dtype == torch.float32
        torch.testing.assert_close(out["boxes"].as_subclass(torch.Tensor), torch.tensor([[2.0, 4.0, 15.0, 26.6667]]),
                                   atol=1e-3, rtol=0)


@pytest.mark.parametrize("backend", ["albumentations", "kornia"])
def test_unknown_names_raise_before_training_naming_them_and_listing_supported(backend):
    pytest.importorskip(backend)
    with pytest.raises(ValueError, match=r"'Sparkle'.*HorizontalFlip"):
        build_augmentation(config(aug_config={"Sparkle": {}}, augmentation_backend=backend))


def test_kornia_rejects_transforms_and_keywords_it_cannot_express():
    pytest.importorskip("kornia")
    with pytest.raises(ValueError, match=r"'CLAHE'.*kornia.*Affine, ColorJitter"):
        build_augmentation(config(aug_config={"CLAHE": {}}, augmentation_backend="kornia"))
    with pytest.raises(ValueError, match=r"'Rotate'.*\['border_mode'\].*limit"):
        build_augmentation(config(aug_config={"Rotate": {"border_mode": 1}}, augmentation_backend="kornia"))
    with pytest.raises(ValueError, match=r"'Rotate'.*low > high"):
        build_augmentation(config(aug_config={"Rotate": {"limit": (10, -10)}}, augmentation_backend="kornia"))


def test_albumentations_bad_keywords_and_non_box_transforms_raise_value_errors():
    pytest.importorskip("albumentations")
    with pytest.raises(ValueError, match=r"aug_config\['Rotate'\]"):
        build_augmentation(config(aug_config={"Rotate": {"limit": "far"}}, augmentation_backend="albumentations"))
    with pytest.raises(ValueError, match="'ToTensorV2'"):  # no box support
        build_augmentation(config(aug_config={"ToTensorV2": {}}, augmentation_backend="albumentations"))
    with pytest.raises(ValidationError, match="aug_config.Rotate"):  # the config itself wants keyword dicts
        config(aug_config={"Rotate": 30})


@pytest.mark.parametrize("backend, package", [("albumentations", "albumentations"), ("kornia", "kornia")])
def test_a_missing_package_names_the_extra(backend, package, monkeypatch):
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")
                 or m.startswith(f"detrkit.datasets.{package}")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # makes `import <package>` fail
    with pytest.raises(ImportError, match=r"detrkit\[augment\]"):
        build_augmentation(config(aug_config={"HorizontalFlip": {}}, augmentation_backend=backend))


def test_albumentations_transform_outputs_normalised_pixels_and_kept_annotations():
    pytest.importorskip("albumentations")
    transform = build_augmentation(config(aug_config={"HorizontalFlip": {"p": 1.0}})).train_transform([32], True, False)
    image, target = sample()
    pixels, out = transform(image, target)
    assert pixels.shape == (3, 32, 32) and pixels.dtype == torch.float32 and pixels.min() < 0
    torch.testing.assert_close(out["boxes"].as_subclass(torch.Tensor), torch.tensor([[17.0, 4.0, 30.0, 26.6667]]),
                               atol=1e-3, rtol=0)
    assert out["labels"].tolist() == [1] and out["area"].tolist() == [900.0]


def test_kornia_splits_the_work_resize_in_workers_augment_on_the_batch():
    pytest.importorskip("kornia")
    built = build_augmentation(config(aug_config={"HorizontalFlip": {"p": 1.0}}, augmentation_backend="kornia"))
    assert isinstance(built, KorniaAugmentation)
    image, target = sample()
    pixels, out = built.train_transform([32], True, False)(image, target)
    assert pixels.dtype == torch.uint8 and pixels.shape == (3, 32, 32)  # resized only
    boxes = out["boxes"].as_subclass(torch.Tensor) / 32
    cxcywh = torch.cat([(boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]], 1)
    batch = Batch(pixels[None], None, [Target(cxcywh, out["labels"], 0, (48, 64), (32, 32), out["area"])])
    augmented = built.batch_augment()(batch)
    assert augmented.pixels.dtype == torch.float32 and augmented.pixels.min() < 0  # normalised
    torch.testing.assert_close(augmented.targets[0].boxes[:, 0], 1 - cxcywh[:, 0])  # flipped


@pytest.mark.parametrize("name", ["AUG_CONSERVATIVE", "AUG_AGGRESSIVE", "AUG_AERIAL", "AUG_INDUSTRIAL"])
@pytest.mark.parametrize("backend", ["albumentations", "kornia"])
def test_presets_build_and_run_on_both_backends(name, backend):
    pytest.importorskip(backend)
    preset = getattr(aug_configs, name)
    assert aug_configs.PRESETS[name.removeprefix("AUG_").lower()] is preset
    built = build_augmentation(config(aug_config=preset, augmentation_backend=backend))
    torch.manual_seed(0)
    image, target = sample()
    pixels, out = built.train_transform([32], True, True)(image, target)
    if backend == "kornia":
        boxes = out["boxes"].as_subclass(torch.Tensor) / 32
        cxcywh = torch.cat([(boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]], 1)
        batch = Batch(pixels[None].repeat(4, 1, 1, 1), None,
                      [Target(cxcywh, out["labels"], 0, (48, 64), (32, 32), out["area"])] * 4)
        pixels = built.batch_augment()(batch).pixels
    assert torch.isfinite(pixels).all() and pixels.shape[-2:] == (32, 32)


def test_albumentations_drops_boxes_an_earlier_crop_left_without_area():
    pytest.importorskip("albumentations")
    transform = build_augmentation(config(aug_config={"HorizontalFlip": {"p": 1.0}})).train_transform([32], True, False)
    image, target = sample()
    target["boxes"] = tv_tensors.BoundingBoxes(torch.tensor([[64.0, 5.0, 64.0, 10.0], [4.0, 6.0, 30.0, 40.0]]),
                                               format="XYXY", canvas_size=(48, 64))
    target["labels"], target["area"] = torch.tensor([4, 7]), torch.tensor([0.0, 2.0])
    _, out = transform(image, target)
    assert out["labels"].tolist() == [7] and out["area"].tolist() == [2.0] and len(out["boxes"]) == 1
