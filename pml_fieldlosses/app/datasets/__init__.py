"""Data for the benchmark: the built-in data sets (``DATASETS``, by name: multi-vendor
emoji, multi-set icons and letters of many typefaces, all from npm and made by one
builder, builder.py; see docs/data.md), or your own image folder."""

from .base import ImageSet, first_half_split, render_files
from .cache import CACHE_ENV_VAR, cache_dir
from .emoji import DEFAULT_VENDORS, LICENSES, PACKAGES, VENDORS, load_emoji
from .glyphs import LICENSES as GLYPH_LICENSES
from .glyphs import load_glyphs, write_glyph_folder
from .icons import LICENSES as ICON_LICENSES
from .icons import load_icons
from .image_folder import IMAGE_EXTENSIONS, load_image_folder
from .npm import IntegrityError, NpmPackage, UnsafeArchiveError, npm_pack, safe_extract, sha512_integrity
from .render import check_svg_renderer, render_file

# name -> (loader(image_size, cache) -> ImageSet, one-line description for reports)
DATASETS = {
    "emoji": (lambda image_size, cache: load_emoji(image_size, cache=cache), "multi-vendor emoji"),
    "icons": (lambda image_size, cache: load_icons(image_size, cache=cache), "multi-set icons"),
    "glyphs": (lambda image_size, cache: load_glyphs(image_size, cache=cache), "letters of many typefaces"),
}
# image licences of the built-in data sets, by source (vendor, icon set or font) name
SOURCE_LICENSES = {**LICENSES, **ICON_LICENSES, **GLYPH_LICENSES}


def load_dataset(data, image_size, cache=None):
    """The built-in data set named ``data`` (see DATASETS), else the image folder at path ``data``."""
    if data in DATASETS:
        return DATASETS[data][0](image_size, cache)
    return load_image_folder(data, image_size)


__all__ = [
    "CACHE_ENV_VAR",
    "DATASETS",
    "DEFAULT_VENDORS",
    "IMAGE_EXTENSIONS",
    "LICENSES",
    "PACKAGES",
    "VENDORS",
    "ImageSet",
    "IntegrityError",
    "SOURCE_LICENSES",
    "NpmPackage",
    "UnsafeArchiveError",
    "cache_dir",
    "check_svg_renderer",
    "first_half_split",
    "load_dataset",
    "load_emoji",
    "load_glyphs",
    "load_icons",
    "load_image_folder",
    "npm_pack",
    "render_file",
    "render_files",
    "safe_extract",
    "sha512_integrity",
    "write_glyph_folder",
]
