"""Turn image files (PNG/JPEG/... and SVG) into square RGB uint8 arrays on white.

How a raster image is read (docs/data.md), whatever its mode and bit depth:

* the first frame of an animated or multi-page file (GIF, APNG, WebP, TIFF);
* turned upright by its EXIF orientation, as image viewers show it;
* modes of 8-bit samples (1, L, LA, P with or without transparency, PA, RGB, RGBA,
  CMYK, YCbCr, LAB, ...) by Pillow's own conversion to RGBA; files of 16 bits per
  colour sample (16-bit RGB and RGBA PNG and TIFF) Pillow reads as 8-bit RGB(A);
* modes of deeper grey samples scaled by the range of the mode (``DEEP_RANGES``) to
  0-255, rounded: 16-bit grey (I;16) and 32-bit integers (I, which Pillow uses for
  16-bit PGM/PPM and signed 16-bit TIFF) by 65535, floats (F) by 1.0; values outside
  the range are clipped, a grey TIFF that says white is zero is inverted, the
  transparent value of a PNG and NaN are transparent;
* transparency composited on white.

A file that is not an image Pillow can read (or is truncated) is a ValueError naming
it; a file that cannot be opened is a FileFault naming it.
"""

import io

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ..errors import file_fault

# the value that becomes 255, by mode, for the modes of more than 8 bits per sample
DEEP_RANGES = {"I;16": 65535, "I;16L": 65535, "I;16B": 65535, "I;16N": 65535, "I": 65535, "F": 1.0}
EXIF_ORIENTATION = 0x0112
TIFF_PHOTOMETRIC = 262  # 0: WhiteIsZero


def check_svg_renderer():
    """Import cairosvg (and with it the system cairo library), or explain how to get them."""
    try:
        import cairosvg
    except (ImportError, OSError) as e:  # OSError: cairocffi cannot find libcairo
        raise RuntimeError(
            "Rendering the SVG emoji needs the Python package cairosvg and the system "
            "cairo library (`pip install cairosvg`; Debian/Ubuntu: `apt-get install libcairo2`; "
            f"macOS: `brew install cairo`). Import failed with: {e}"
        ) from e
    return cairosvg


def deep_to_rgba(image):
    """A grey image of a mode in DEEP_RANGES as 8-bit RGBA: scaled by the mode's range."""
    values = np.asarray(image, dtype=np.float64)
    alpha = np.full(values.shape, 255, dtype=np.uint8)
    transparent = image.info.get("transparency")
    if isinstance(transparent, (int, float)):
        alpha[values == transparent] = 0
    alpha[np.isnan(values)] = 0
    top = DEEP_RANGES[image.mode]
    if getattr(image, "tag_v2", {}).get(TIFF_PHOTOMETRIC) == 0:  # Pillow leaves these uninverted
        values = top - values
    grey = np.rint(np.clip(np.nan_to_num(values) * (255 / top), 0, 255)).astype(np.uint8)
    return Image.fromarray(np.stack([grey, grey, grey, alpha], axis=-1))


def orientation(image):
    """The EXIF orientation of ``image`` (1: upright); 1 where its EXIF block cannot be
    parsed (viewers then show the pixels as stored, and so does this)."""
    image.load()  # a PNG's EXIF block may follow its pixels
    if "exif" not in image.info and not hasattr(image, "tag_v2"):  # no EXIF: no need to parse
        return 1
    try:
        return image.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 (Pillow raises several kinds for a damaged EXIF block)
        return 1


def to_rgba(image):
    """``image`` (any mode Pillow opens) upright and as 8-bit RGBA, by the rules above."""
    if orientation(image) != 1:
        image = ImageOps.exif_transpose(image)
    if image.mode in DEEP_RANGES:
        return deep_to_rgba(image)
    if image.mode == "La":  # premultiplied: Pillow converts it to LA only
        image = image.convert("LA")
    return image.convert("RGBA")


def to_square_rgb(image, size):
    """Composite ``image`` (any PIL mode, see ``to_rgba``) on white, pad it to a square
    with white (keeping all of it) and resize to ``size`` x ``size``."""
    image = to_rgba(image)
    width, height = image.size
    side = max(width, height)
    canvas = Image.new("RGBA", (side, side), (255, 255, 255, 255))
    canvas.alpha_composite(image, ((side - width) // 2, (side - height) // 2))
    rgb = canvas.convert("RGB")
    if side != size:
        rgb = rgb.resize((size, size), Image.Resampling.LANCZOS)
    return np.asarray(rgb, dtype=np.uint8)


def render_image(data, size):
    """Bytes of a raster image (PNG, JPEG, GIF, WebP, BMP, TIFF, ...) -> (size, size, 3)
    uint8, its first frame."""
    with Image.open(io.BytesIO(data)) as image:
        image.seek(0)
        return to_square_rgb(image, size)


def render_svg(data, size):
    """Bytes of an SVG file -> (size, size, 3) uint8, rendered by cairosvg at the
    target size (aspect ratio kept, centred on white)."""
    cairosvg = check_svg_renderer()
    png = cairosvg.svg2png(bytestring=data, output_width=size, output_height=size)
    return render_image(png, size)


def render_file(path, size):
    """Render one file, SVG or raster, chosen by its extension. A file that cannot be
    read is a FileFault naming it; one that is not an image (or is truncated) a
    ValueError naming it; RuntimeError if SVG needs a renderer that is not installed."""
    svg = str(path).lower().endswith(".svg")
    if svg:
        check_svg_renderer()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise file_fault(e, path, "reading the image") from e
    try:
        return render_svg(data, size) if svg else render_image(data, size)
    except Exception as e:  # Pillow and cairosvg raise many kinds for a bad file
        if isinstance(e, UnidentifiedImageError):
            problem = "not an image that Pillow can read"
        else:
            problem = f"{type(e).__name__}: {e}"
        raise ValueError(
            f"cannot read the image {path}: {problem}; replace it with a readable image or remove it"
        ) from e
