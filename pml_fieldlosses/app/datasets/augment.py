"""Batched image augmentation in plain torch (no torchvision).

Images are float tensors (N, 3, H, W) with values in [0, 255] on a white
background. One call draws an independent random transform per image from a
``torch.Generator``, so a seeded generator gives the same views every time.
"""

import math

import torch


def to_float_nchw(images):
    """uint8 (N, H, W, 3) array or tensor -> float32 (N, 3, H, W) in [0, 255]."""
    images = torch.as_tensor(images)
    return images.permute(0, 3, 1, 2).float()


def random_affine(images, generator, zoom=(0.75, 1.15), max_rotation_deg=15.0, max_shift=0.12, flip=0.5):
    """Random zoom, rotation, shift and horizontal flip; uncovered pixels are white."""
    n = len(images)

    def uniform(low, high, *shape):
        return torch.empty(n, *shape).uniform_(low, high, generator=generator)

    scale = uniform(*zoom)
    angle = uniform(-1, 1) * math.radians(max_rotation_deg)
    sign = torch.where(torch.rand(n, generator=generator) < flip, -1.0, 1.0)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = scale * torch.cos(angle) * sign
    theta[:, 0, 1] = -scale * torch.sin(angle)
    theta[:, 1, 0] = scale * torch.sin(angle) * sign
    theta[:, 1, 1] = scale * torch.cos(angle)
    theta[:, :, 2] = uniform(-max_shift, max_shift, 2)
    theta = theta.to(images.device)
    grid = torch.nn.functional.affine_grid(theta, list(images.shape), align_corners=False)
    # sample the "ink" (255 - x) with zero padding, so the border fills with white
    ink = torch.nn.functional.grid_sample(255 - images, grid, align_corners=False, padding_mode="zeros")
    return 255 - ink


def random_color(images, generator, saturation=(0.3, 1.5), grayscale=0.2, brightness=0.2, contrast=0.3):
    """Random saturation (grayscale with probability ``grayscale``), brightness and contrast."""
    n = len(images)

    def uniform(low, high):
        return torch.empty(n, 1, 1, 1).uniform_(low, high, generator=generator).to(images.device)

    gray = images.mean(dim=1, keepdim=True)
    sat = uniform(*saturation)
    sat = torch.where(torch.rand(n, 1, 1, 1, generator=generator).to(images.device) < grayscale, 0.0, sat)
    images = gray + (images - gray) * sat
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    images = (images - mean) * uniform(1 - contrast, 1 + contrast) + mean
    images = images * uniform(1 - brightness, 1 + brightness)
    return images.clamp(0, 255)


def augment(images, generator):
    """The benchmark's training augmentation: random affine, then random colour."""
    return random_color(random_affine(images, generator), generator)
