"""Albumentations transforms re-expressed as batched tensor ops, one random draw per sample.

Each op reads the keyword arguments Albumentations documents for its namesake, with the same
defaults and ranges. Coins and parameters are drawn on the host (a few numbers per image), so
knowing which images an op touches costs no device sync, and an op works on those images only.
Geometric ops return (B, 3, 3) host matrices in continuous pixel coordinates of each image
((0, 0) its top-left corner, (w, h) its bottom-right), identity where the coin said no; the
pipeline composes them and warps once. Colour ops take images (B, C, H, W) in [0, 1].
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from kornia.color import rgb_to_grayscale
from kornia.filters import gaussian_blur2d

Range = tuple[float, float]


class Draws:
    """Random draws for one batch, all from one seed: coins and parameters from `host`, pixel
    noise from `generator` on the batch's device."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = device
        self.host = torch.Generator().manual_seed(seed)
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def uniform(self, bounds: Range, count: int) -> torch.Tensor:
        low, high = bounds
        return low + (high - low) * torch.rand(count, generator=self.host, dtype=torch.float64).float()

    def coin(self, p: float, count: int) -> torch.Tensor:
        return torch.rand(count, generator=self.host) < p

    def chosen(self, p: float, count: int) -> torch.Tensor:
        """Indices of the images an op with probability p applies to."""
        return self.coin(p, count).nonzero()[:, 0]

    def integers(self, low: int, high: int, count: int) -> torch.Tensor:
        """Uniform in [low, high], both ends included."""
        return torch.randint(low, high + 1, (count,), generator=self.host)


def on_chosen(images: torch.Tensor, valid: torch.Tensor | None, chosen: torch.Tensor, op) -> torch.Tensor:
    """op(images, valid) on the chosen images only, written back into `images` (which the caller
    owns); the others stay as they are."""
    if len(chosen) == len(images):
        return op(images, valid)
    if not len(chosen):
        return images
    index = chosen.to(images.device, non_blocking=True)
    part_valid = None if valid is None else valid.index_select(0, index)
    return images.index_copy_(0, index, op(images.index_select(0, index), part_valid))


def on_device(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(n,) host parameters -> (n, 1, 1, 1) on the images' device."""
    return values.to(like.device, non_blocking=True)[:, None, None, None]


def bounds(value: float | Sequence[float], low: float | None = None) -> Range:
    """A (low, high) pair as Albumentations reads a range argument: a pair stays; a number v
    becomes (-v, v) when `low` is None, else the sorted pair (low, v)."""
    if isinstance(value, (int, float)):
        pair = (-abs(value), abs(value)) if low is None else tuple(sorted((low, value)))
    elif len(value) == 2:
        pair = tuple(value)
    else:
        raise ValueError(f"expected a number or a (low, high) pair, got {value!r}")
    if pair[0] > pair[1]:
        raise ValueError(f"range {value!r} has low > high")
    return float(pair[0]), float(pair[1])


def _around_centre(sizes: torch.Tensor, linear: torch.Tensor,
                   shift: torch.Tensor | None = None) -> torch.Tensor:
    """(B, 3, 3) = T(centre + shift) @ linear @ T(-centre); sizes (B, 2) as (w, h), linear (B, 2, 2)."""
    centre = sizes / 2
    matrix = torch.zeros(len(sizes), 3, 3, device=sizes.device)
    matrix[:, :2, :2] = linear
    offset = centre if shift is None else centre + shift
    matrix[:, :2, 2] = offset - (linear @ centre[:, :, None])[:, :, 0]
    matrix[:, 2, 2] = 1
    return matrix


def _rotation(degrees: torch.Tensor) -> torch.Tensor:
    """(B, 2, 2) rotation as Albumentations builds it (positive turns counter-clockwise on screen)."""
    radians = torch.deg2rad(degrees % 360)
    cos, sin = torch.cos(radians), torch.sin(radians)
    return torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], -2)


def _keep_where(applied: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    identity = torch.eye(3, device=matrix.device).expand_as(matrix)
    return torch.where(applied[:, None, None], matrix, identity)


class HorizontalFlip:
    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def matrices(self, sizes: torch.Tensor, draws: Draws) -> torch.Tensor:
        linear = torch.diag(torch.tensor([-1.0, 1.0], device=sizes.device)).expand(len(sizes), 2, 2)
        return _keep_where(draws.coin(self.p, len(sizes)), _around_centre(sizes, linear))


class VerticalFlip:
    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def matrices(self, sizes: torch.Tensor, draws: Draws) -> torch.Tensor:
        linear = torch.diag(torch.tensor([1.0, -1.0], device=sizes.device)).expand(len(sizes), 2, 2)
        return _keep_where(draws.coin(self.p, len(sizes)), _around_centre(sizes, linear))


class RandomRotate90:
    """k * 90 degrees, k uniform in 0..3; non-square images turn inside their own frame."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def matrices(self, sizes: torch.Tensor, draws: Draws) -> torch.Tensor:
        applied = draws.coin(self.p, len(sizes))
        turns = draws.integers(0, 3, len(sizes)).float()
        return _keep_where(applied, _around_centre(sizes, _rotation(turns * 90).round()))


class Rotate:
    def __init__(self, limit: float | Sequence[float] = (-90, 90), rotate_method: str = "largest_box",
                 crop_border: bool = False, fill: float = 0, p: float = 0.5) -> None:
        if rotate_method != "largest_box" or crop_border or fill != 0:
            raise ValueError("only rotate_method='largest_box', crop_border=False and fill=0 are supported")
        self.limit, self.p = bounds(limit), p

    def matrices(self, sizes: torch.Tensor, draws: Draws) -> torch.Tensor:
        applied = draws.coin(self.p, len(sizes))
        return _keep_where(applied, _around_centre(sizes, _rotation(draws.uniform(self.limit, len(sizes)))))


class Affine:
    """Scale, rotate, shear and translate about the centre, in Albumentations' order and signs;
    translations are whole pixels (truncated), as there."""

    def __init__(self, scale: float | Sequence[float] = (1.0, 1.0),
                 translate_percent: float | Sequence[float] | None = None,
                 rotate: float | Sequence[float] = 0.0, shear: float | Sequence[float] = (0.0, 0.0),
                 keep_ratio: bool = False, rotate_method: str = "largest_box", fill: float = 0,
                 p: float = 0.5) -> None:
        if rotate_method != "largest_box" or fill != 0:
            raise ValueError("only rotate_method='largest_box' and fill=0 are supported")
        self.scale, self.rotate, self.shear = _fixed_or_range(scale), _fixed_or_range(rotate), _fixed_or_range(shear)
        self.translate = _fixed_or_range(0.0 if translate_percent is None else translate_percent)
        self.keep_ratio, self.p = keep_ratio, p

    def matrices(self, sizes: torch.Tensor, draws: Draws) -> torch.Tensor:
        count = len(sizes)
        applied = draws.coin(self.p, count)
        shift = torch.stack([draws.uniform(self.translate, count), draws.uniform(self.translate, count)], -1)
        shift = torch.trunc(shift * sizes)
        shear_x, shear_y = -draws.uniform(self.shear, count), -draws.uniform(self.shear, count)
        scale_x = draws.uniform(self.scale, count)
        scale_y = scale_x if self.keep_ratio else draws.uniform(self.scale, count)
        rotation = _rotation(draws.uniform(self.rotate, count))
        ones = torch.ones_like(scale_x)
        shear = torch.stack([torch.stack([ones, torch.tan(torch.deg2rad(shear_x))], -1),
                             torch.stack([torch.tan(torch.deg2rad(shear_y)), ones], -1)], -2)
        linear = shear @ rotation @ torch.diag_embed(torch.stack([scale_x, scale_y], -1))
        return _keep_where(applied, _around_centre(sizes, linear, shift))


def _number(value: object) -> bool:
    return isinstance(value, (int, float))


def _fixed_or_range(value: float | Sequence[float]) -> Range:
    """Affine's reading: a number is that value every time, a pair a range."""
    return bounds(value, value) if _number(value) else bounds(value)


def masked_mean(values: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """(B, C, 1, 1) mean of each channel over each image's own pixels; values (B, C, H, W), valid
    (B, 1, H, W) or None."""
    if valid is None:
        return values.mean(dim=(2, 3), keepdim=True)
    return (values * valid).sum(dim=(2, 3), keepdim=True) / valid.sum(dim=(2, 3), keepdim=True).clamp(min=1)


class RandomBrightnessContrast:
    """image * (1 + c) + b (b scaled by the image's mean when brightness_by_max is False), clipped."""

    def __init__(self, brightness_limit: float | Sequence[float] = (-0.2, 0.2),
                 contrast_limit: float | Sequence[float] = (-0.2, 0.2), brightness_by_max: bool = True,
                 p: float = 0.5) -> None:
        self.brightness, self.contrast = bounds(brightness_limit), bounds(contrast_limit)
        self.by_max, self.p = brightness_by_max, p

    def __call__(self, images: torch.Tensor, valid: torch.Tensor | None, draws: Draws) -> torch.Tensor:
        chosen = draws.chosen(self.p, len(images))
        alpha = on_device(1 + draws.uniform(self.contrast, len(chosen)), images)
        beta = on_device(draws.uniform(self.brightness, len(chosen)), images)

        def adjust(part: torch.Tensor, part_valid: torch.Tensor | None) -> torch.Tensor:
            shift = beta if self.by_max else beta * masked_mean(part.mean(1, keepdim=True), part_valid)
            return (part * alpha + shift).clamp_(0, 1)
        return on_chosen(images, valid, chosen, adjust)


class ColorJitter:
    """torchvision-style brightness, contrast, saturation and hue factors, in a random order drawn
    once per batch (Albumentations draws it per image). Brightness, contrast and saturation are
    linear in the pixels, so consecutive ones fold into one 3 x 3 colour matrix per image, applied
    in one pass and clipped once (Albumentations clips after each)."""

    def __init__(self, brightness: float | Sequence[float] = (0.8, 1.2),
                 contrast: float | Sequence[float] = (0.8, 1.2),
                 saturation: float | Sequence[float] = (0.8, 1.2), hue: float | Sequence[float] = (-0.5, 0.5),
                 p: float = 0.5) -> None:
        self.ranges = [_factor_range(brightness), _factor_range(contrast), _factor_range(saturation), bounds(hue)]
        self.p = p

    def __call__(self, images: torch.Tensor, valid: torch.Tensor | None, draws: Draws) -> torch.Tensor:
        chosen = draws.chosen(self.p, len(images))
        factors = [draws.uniform(r, len(chosen)).to(images.device, non_blocking=True) for r in self.ranges]
        identity = (1.0, 1.0, 1.0, 0.0)
        order = [step for step in torch.randperm(4, generator=draws.host).tolist()
                 if self.ranges[step] != (identity[step],) * 2]  # steps that never change anything go

        def jitter(part: torch.Tensor, part_valid: torch.Tensor | None) -> torch.Tensor:
            colour = ColourMap(part, part_valid)
            for step in order:
                if step == 3:
                    part = shift_hue(colour.apply(part), factors[3][:, None, None, None]).clamp_(0, 1)
                    colour = ColourMap(part, part_valid)
                else:
                    colour.fold(step, factors[step])
            return colour.apply(part)
        return on_chosen(images, valid, chosen, jitter)


GRAY = (0.299, 0.587, 0.114)  # rgb_to_grayscale's weights


class ColourMap:
    """A per-image affine colour map x -> M x + o, built up step by step, starting at identity."""

    def __init__(self, images: torch.Tensor, valid: torch.Tensor | None) -> None:
        count, device = len(images), images.device
        self.matrix = torch.eye(3, device=device).repeat(count, 1, 1)  # (n, 3, 3)
        self.offset = torch.zeros(count, 3, device=device)
        self.gray = torch.tensor(GRAY, device=device)
        self.images, self.valid = images, valid  # their channel means, for contrast, when first needed
        self.changed = False

    def fold(self, step: int, factor: torch.Tensor) -> None:
        """Follow the map with brightness (0), contrast (1) or saturation (2) by `factor` (n,)."""
        factor = factor[:, None]
        if step == 0:
            self.matrix, self.offset = self.matrix * factor[:, :, None], self.offset * factor
        elif step == 1:  # towards the mean grey level of the image as mapped so far
            means = masked_mean(self.images, self.valid)[:, :, :, 0]  # (n, 3, 1)
            mean = ((self.matrix @ means)[:, :, 0] + self.offset) @ self.gray
            self.matrix = self.matrix * factor[:, :, None]
            self.offset = self.offset * factor + (mean[:, None] * (1 - factor))
        else:  # towards each pixel's grey level: (s I + (1 - s) 1 g^T)
            mixing = torch.eye(3, device=factor.device) * factor[:, :, None] + \
                (1 - factor[:, :, None]) * self.gray.expand(3, 3)
            self.matrix, self.offset = mixing @ self.matrix, (mixing @ self.offset[:, :, None])[:, :, 0]
        self.changed = True

    def apply(self, images: torch.Tensor) -> torch.Tensor:
        if not self.changed:
            return images
        count, channels, height, width = images.shape
        mapped = torch.baddbmm(self.offset[:, :, None], self.matrix, images.reshape(count, channels, -1))
        return mapped.reshape(images.shape).clamp_(0, 1)


def shift_hue(rgb: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Turn each image's HSV hue by `turns` (n, 1, 1, 1) of a full circle, keeping saturation and
    value, without building the HSV image: the hue is found in sixths of the circle and each
    channel rebuilt as value - chroma * clamp(min(k, 4 - k), 0, 1), k = (5, 3, 1) + hue mod 6."""
    top = rgb.amax(1, keepdim=True)
    chroma = top - rgb.amin(1, keepdim=True)
    red, green, blue = rgb[:, 0:1], rgb[:, 1:2], rgb[:, 2:3]
    red_top, green_top = top == red, top == green
    difference = torch.where(red_top, green - blue, torch.where(green_top, blue - red, red - green))
    sixths = difference.div_(chroma.clamp(min=1e-12)).add_(torch.where(red_top, 0.0, torch.where(green_top, 2.0, 4.0)))
    sixths = sixths.add_(turns * 6)
    k = torch.remainder(torch.tensor([5.0, 3.0, 1.0], device=rgb.device)[:, None, None] + sixths, 6)  # (n, 3, H, W)
    return top - chroma * torch.minimum(k, 4 - k).clamp_(0, 1)


def _factor_range(value: float | Sequence[float]) -> Range:
    if _number(value):
        return max(0.0, 1 - value), 1 + value
    return bounds(value)


class RandomGamma:
    def __init__(self, gamma_limit: float | Sequence[float] = (80, 120), p: float = 0.5) -> None:
        self.limit, self.p = bounds(gamma_limit, 1), p

    def __call__(self, images: torch.Tensor, valid: torch.Tensor | None, draws: Draws) -> torch.Tensor:
        chosen = draws.chosen(self.p, len(images))
        gamma = on_device(draws.uniform(self.limit, len(chosen)) / 100, images)
        return on_chosen(images, valid, chosen, lambda part, _: part.clamp(min=0).pow_(gamma))


class GaussianBlur:
    """Per-image sigma; every image's kernel is cut at the largest size the settings allow."""

    def __init__(self, blur_limit: int | Sequence[int] = 0, sigma_limit: float | Sequence[float] = (0.5, 3.0),
                 p: float = 0.5) -> None:
        self.sigma = bounds(sigma_limit, 0)
        largest = int(bounds(blur_limit, 0)[1])
        self.size = largest if largest > 0 else int(self.sigma[1] * 3.5) * 2 + 1
        self.size += 1 - self.size % 2  # odd
        self.p = p

    def __call__(self, images: torch.Tensor, valid: torch.Tensor | None, draws: Draws) -> torch.Tensor:
        chosen = draws.chosen(self.p, len(images))
        sigma = draws.uniform(self.sigma, len(chosen)).clamp(min=1e-3)
        sigma = torch.stack([sigma, sigma], -1).to(images.device, non_blocking=True)
        return on_chosen(images, valid, chosen, lambda part, _: gaussian_blur2d(part, self.size, sigma))


class GaussNoise:
    def __init__(self, std_range: Sequence[float] = (0.2, 0.44), mean_range: Sequence[float] = (0.0, 0.0),
                 per_channel: bool = True, p: float = 0.5) -> None:
        self.std, self.mean = bounds(std_range), bounds(mean_range)
        self.per_channel, self.p = per_channel, p

    def __call__(self, images: torch.Tensor, valid: torch.Tensor | None, draws: Draws) -> torch.Tensor:
        chosen = draws.chosen(self.p, len(images))
        std = on_device(draws.uniform(self.std, len(chosen)), images)
        mean = on_device(draws.uniform(self.mean, len(chosen)), images)

        def noisy(part: torch.Tensor, part_valid: torch.Tensor | None) -> torch.Tensor:
            count, channels, height, width = part.shape
            shape = (count, channels if self.per_channel else 1, height, width)
            noise = torch.randn(shape, generator=draws.generator, device=part.device, dtype=part.dtype)
            return (part + noise.mul_(std).add_(mean)).clamp_(0, 1)
        return on_chosen(images, valid, chosen, noisy)


class ToGray:
    def __init__(self, num_output_channels: int = 3, method: str = "weighted_average", p: float = 0.5) -> None:
        if method != "weighted_average" or num_output_channels != 3:
            raise ValueError("only method='weighted_average' with num_output_channels=3 is supported")
        self.p = p

    def __call__(self, images: torch.Tensor, valid: torch.Tensor | None, draws: Draws) -> torch.Tensor:
        chosen = draws.chosen(self.p, len(images))
        return on_chosen(images, valid, chosen, lambda part, _: rgb_to_grayscale(part).expand_as(part).contiguous())


GEOMETRIC = {op.__name__: op for op in (HorizontalFlip, VerticalFlip, RandomRotate90, Rotate, Affine)}
COLOUR = {op.__name__: op for op in (RandomBrightnessContrast, ColorJitter, RandomGamma, GaussianBlur,
                                      GaussNoise, ToGray)}
