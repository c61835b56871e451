"""Turn image files (PNG/JPEG/... and SVG) into square RGB uint8 arrays on white."""

import io

import numpy as np
from PIL import Image


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


def to_square_rgb(image, size):
    """Composite ``image`` (any PIL mode) on white, pad it to a square with white
    (keeping all of it) and resize to ``size`` x ``size``."""
    image = image.convert("RGBA")
    width, height = image.size
    side = max(width, height)
    canvas = Image.new("RGBA", (side, side), (255, 255, 255, 255))
    canvas.alpha_composite(image, ((side - width) // 2, (side - height) // 2))
    rgb = canvas.convert("RGB")
    if side != size:
        rgb = rgb.resize((size, size), Image.Resampling.LANCZOS)
    return np.asarray(rgb, dtype=np.uint8)


def render_image(data, size):
    """Bytes of a raster image (PNG, JPEG, GIF, WebP, BMP) -> (size, size, 3) uint8."""
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
    """Render one file, SVG or raster, chosen by its extension; ValueError
    naming the file if it cannot be read as an image."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        if str(path).lower().endswith(".svg"):
            return render_svg(data, size)
        return render_image(data, size)
    except RuntimeError:  # no SVG renderer: says how to install one
        raise
    except Exception as e:  # PIL and cairosvg raise many kinds for a bad file
        raise ValueError(f"cannot read the image {path}: {type(e).__name__}: {e}") from None
