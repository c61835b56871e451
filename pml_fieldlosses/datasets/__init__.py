"""Data for the benchmark: multi-vendor emoji from npm, or your own image folder."""

from .base import ImageSet, first_half_split, render_files
from .cache import CACHE_ENV_VAR, cache_dir
from .emoji import DEFAULT_VENDORS, LICENSES, PACKAGES, VENDORS, load_emoji
from .image_folder import IMAGE_EXTENSIONS, load_image_folder
from .npm import IntegrityError, NpmPackage, UnsafeArchiveError, npm_pack, safe_extract, sha512_integrity
from .render import check_svg_renderer, render_file

__all__ = [
    "CACHE_ENV_VAR",
    "DEFAULT_VENDORS",
    "IMAGE_EXTENSIONS",
    "LICENSES",
    "PACKAGES",
    "VENDORS",
    "ImageSet",
    "IntegrityError",
    "NpmPackage",
    "UnsafeArchiveError",
    "cache_dir",
    "check_svg_renderer",
    "first_half_split",
    "load_emoji",
    "load_image_folder",
    "npm_pack",
    "render_file",
    "render_files",
    "safe_extract",
    "sha512_integrity",
]
