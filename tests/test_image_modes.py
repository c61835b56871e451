"""Every image mode and bit depth is read as its 8-bit copy (the rule of datasets/render.py,
docs/data.md): an 8-bit picture drawn by hypothesis is written in each mode and file
format (16 bits by multiplying by 257, floats by dividing by 255, ...), read back through
the data sets' loader (``render_file``, as ``load_image_folder`` reads), and compared with
the reading of its 8-bit PNG: within one level. Images of 8-bit modes are read exactly as
before the rule (Pillow's conversion to RGBA, composited on white). A file that is not an
image, or is cut short, is a ValueError naming it."""

import io
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image, ImageCms

from pml_fieldlosses.app.datasets import load_image_folder, render_file
from pml_fieldlosses.app.datasets.render import DEEP_RANGES, to_square_rgb

FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def encode(image, fmt, **options):
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def png16(samples, color_type):
    """A PNG of 16 bits per sample (Pillow writes none but grey): ``samples`` uint16
    (H, W) or (H, W, C); color_type 0 grey, 2 RGB, 4 grey + alpha, 6 RGBA."""
    height, width = samples.shape[:2]
    rows = samples.reshape(height, -1).astype(">u2")
    raw = b"".join(b"\0" + row.tobytes() for row in rows)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 16, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def tiff(samples, photometric, extra_samples=None):
    """An uncompressed little-endian TIFF of ``samples`` (H, W) or (H, W, C), uint8, uint16
    or float32, one strip (Pillow writes no 16-bit colour and no WhiteIsZero TIFF)."""
    height, width = samples.shape[:2]
    channels = 1 if samples.ndim == 2 else samples.shape[2]
    bits = samples.dtype.itemsize * 8
    pixels = samples.astype(samples.dtype.newbyteorder("<")).tobytes()
    tags = {256: width, 257: height, 258: bits, 259: 1, 262: photometric, 273: 0, 277: channels}
    tags.update({278: height, 279: len(pixels), 284: 1, 339: 3 if samples.dtype.kind == "f" else 1})
    if extra_samples is not None:
        tags[338] = extra_samples
    ifd_size = 2 + 12 * len(tags) + 4
    bits_at = 8 + ifd_size  # the BitsPerSample values when there are several
    pixels_at = bits_at + 2 * channels
    tags[273] = pixels_at
    out = b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", len(tags))
    for tag in sorted(tags):
        if tag == 258 and channels > 1:
            out += struct.pack("<HHII", tag, 3, channels, bits_at)
        elif tag in (273, 279):
            out += struct.pack("<HHII", tag, 4, 1, tags[tag])
        else:
            out += struct.pack("<HHIHH", tag, 3, 1, tags[tag], 0)
    return out + struct.pack("<I", 0) + struct.pack(f"<{channels}H", *[bits] * channels) + pixels


def exact_palette(colours):
    """(indices (H, W), palette entries (N, C)) of an image of at most 256 colours."""
    height, width, depth = colours.shape
    entries, inverse = np.unique(colours.reshape(-1, depth), axis=0, return_inverse=True)
    return inverse.reshape(height, width).astype(np.uint8), entries


def palette_image(colours):
    indices, entries = exact_palette(colours)
    image = Image.fromarray(indices)  # mode L: made P below
    image = image.convert("P")
    image.putpalette(entries.astype(np.uint8).tobytes(), rawmode="RGBA" if entries.shape[1] == 4 else "RGB")
    return image


def grey_of(rgba):
    return rgba[..., 0]


def rgba_image(rgba):
    return Image.fromarray(rgba)


def rgb_image(rgba):
    return Image.fromarray(np.ascontiguousarray(rgba[..., :3]))


def grey_image(rgba):
    return Image.fromarray(np.ascontiguousarray(grey_of(rgba)))


def black_white(rgba):
    return Image.fromarray(np.where(grey_of(rgba) >= 128, 255, 0).astype(np.uint8))


def grey_alpha_image(rgba):
    return Image.fromarray(np.stack([grey_of(rgba)] * 3 + [rgba[..., 3]], axis=-1))


def animated_gif(rgba):
    first = palette_image(rgba[..., :3])
    second = palette_image(255 - rgba[..., :3])
    buffer = io.BytesIO()
    first.save(buffer, format="GIF", save_all=True, append_images=[second], duration=100, loop=0)
    return buffer.getvalue()


def pgm_maxval(grey, maxval):
    values = np.rint(grey.astype(np.float64) * maxval / 255).astype(">u2")
    height, width = grey.shape
    return f"P5\n{width} {height}\n{maxval}\n".encode() + values.tobytes()


def png_with_exif(upright, orientation):
    """The PNG whose pixels, turned by EXIF ``orientation`` as a viewer does, are ``upright``."""
    undo = {
        2: Image.Transpose.FLIP_LEFT_RIGHT,
        3: Image.Transpose.ROTATE_180,
        4: Image.Transpose.FLIP_TOP_BOTTOM,
        5: Image.Transpose.TRANSPOSE,
        6: Image.Transpose.ROTATE_90,
        7: Image.Transpose.TRANSVERSE,
        8: Image.Transpose.ROTATE_270,
    }
    stored = upright.transpose(undo[orientation]) if orientation in undo else upright
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(stored, "PNG", exif=exif)


def i16_with_transparency(rgba):
    grey = grey_of(rgba)
    image = Image.fromarray(grey.astype(np.uint16) * 257)
    return encode(image, "PNG", transparency=int(grey[0, 0]) * 257)


def grey_transparent_at_first(rgba):
    grey = grey_of(rgba)
    alpha = np.where(grey == grey[0, 0], 0, 255).astype(np.uint8)
    return Image.fromarray(np.stack([grey, grey, grey, alpha], axis=-1))


def u16(array):
    return array.astype(np.uint16) * 257


def big_endian_16(grey):
    """An I;16B image (Pillow's convert("I;16B") clips to 255: made from bytes)."""
    return Image.frombytes("I;16B", grey.shape[::-1], u16(grey).astype(">u2").tobytes())


# name -> (the file's bytes from an RGBA uint8 picture, its suffix, the 8-bit image it must read as)
CASES = {
    "1 png": (lambda a: encode(black_white(a).convert("1"), "PNG"), ".png", black_white),
    "1 tiff": (lambda a: encode(black_white(a).convert("1"), "TIFF"), ".tiff", black_white),
    "L png": (lambda a: encode(grey_image(a), "PNG"), ".png", grey_image),
    "L bmp": (lambda a: encode(grey_image(a), "BMP"), ".bmp", grey_image),
    "L tiff WhiteIsZero": (lambda a: tiff(255 - grey_of(a), 0), ".tif", grey_image),
    "LA png": (lambda a: encode(grey_alpha_image(a).convert("LA"), "PNG"), ".png", grey_alpha_image),
    "LA tiff": (lambda a: encode(grey_alpha_image(a).convert("LA"), "TIFF"), ".tiff", grey_alpha_image),
    "P png": (lambda a: encode(palette_image(a[..., :3]), "PNG"), ".png", rgb_image),
    "P png with alpha": (lambda a: encode(palette_image(a), "PNG"), ".png", rgba_image),
    "P gif": (lambda a: encode(palette_image(a[..., :3]), "GIF"), ".gif", rgb_image),
    "P animated gif": (animated_gif, ".gif", rgb_image),
    "PA tiff": (lambda a: encode(palette_image(a[..., :3]).convert("PA"), "TIFF"), ".tiff", rgb_image),
    "RGB png": (lambda a: encode(rgb_image(a), "PNG"), ".png", rgb_image),
    "RGB tiff": (lambda a: encode(rgb_image(a), "TIFF"), ".tiff", rgb_image),
    "RGB bmp": (lambda a: encode(rgb_image(a), "BMP"), ".bmp", rgb_image),
    "RGB webp lossless": (lambda a: encode(rgb_image(a), "WEBP", lossless=True), ".webp", rgb_image),
    "RGBA tiff": (lambda a: encode(rgba_image(a), "TIFF"), ".tiff", rgba_image),
    "RGBA webp lossless": (lambda a: encode(rgba_image(a), "WEBP", lossless=True), ".webp", rgba_image),
    "CMYK tiff": (lambda a: encode(rgb_image(a).convert("CMYK"), "TIFF"), ".tiff", rgb_image),
    "I;16 png": (lambda a: encode(Image.fromarray(u16(grey_of(a))), "PNG"), ".png", grey_image),
    "I;16 png transparent value": (i16_with_transparency, ".png", grey_transparent_at_first),
    "I;16 tiff": (lambda a: encode(Image.fromarray(u16(grey_of(a))), "TIFF"), ".tiff", grey_image),
    "I;16B tiff": (lambda a: encode(big_endian_16(grey_of(a)), "TIFF"), ".tif", grey_image),
    "I;16 tiff WhiteIsZero": (lambda a: tiff(u16(255 - grey_of(a)), 0), ".tif", grey_image),
    "I tiff": (lambda a: encode(Image.fromarray(np.int32(u16(grey_of(a)))), "TIFF"), ".tif", grey_image),
    "I pgm 16-bit": (lambda a: encode(Image.fromarray(u16(grey_of(a))), "PPM"), ".pgm", grey_image),
    "I pgm maxval 1023": (lambda a: pgm_maxval(grey_of(a), 1023), ".pgm", grey_image),
    "F tiff": (lambda a: encode(Image.fromarray(grey_of(a).astype(np.float32) / 255), "TIFF"), ".tiff",
               grey_image),
    "F tiff hand-made": (lambda a: tiff(grey_of(a).astype(np.float32) / 255, 1), ".tif", grey_image),
    "RGB png 16-bit": (lambda a: png16(u16(a[..., :3]), 2), ".png", rgb_image),
    "RGBA png 16-bit": (lambda a: png16(u16(a), 6), ".png", rgba_image),
    "LA png 16-bit": (lambda a: png16(u16(np.stack([grey_of(a), a[..., 3]], -1)), 4), ".png",
                      grey_alpha_image),
    "RGB tiff 16-bit": (lambda a: tiff(u16(a[..., :3]), 2), ".tif", rgb_image),
    "RGBA tiff 16-bit": (lambda a: tiff(u16(a), 2, extra_samples=2), ".tif", rgba_image),
}  # fmt: skip
# the file modes that each case's file opens as (checked: a case that stops testing its mode fails)
OPENS_AS = {
    "1 png": "1", "1 tiff": "1", "L png": "L", "L bmp": "L", "L tiff WhiteIsZero": "L",
    "LA png": "LA", "LA tiff": "LA", "P png": "P", "P png with alpha": "P", "P gif": "P",
    "P animated gif": "P", "PA tiff": "PA", "RGB png": "RGB", "RGB tiff": "RGB", "RGB bmp": "RGB",
    "RGB webp lossless": "RGB", "RGBA tiff": "RGBA", "RGBA webp lossless": "RGBA", "CMYK tiff": "CMYK",
    "I;16 png": "I;16", "I;16 png transparent value": "I;16", "I;16 tiff": "I;16", "I;16B tiff": "I;16B",
    "I;16 tiff WhiteIsZero": "I;16", "I tiff": "I", "I pgm 16-bit": "I", "I pgm maxval 1023": "I",
    "F tiff": "F", "F tiff hand-made": "F", "RGB png 16-bit": "RGB", "RGBA png 16-bit": "RGBA",
    "LA png 16-bit": "RGBA", "RGB tiff 16-bit": "RGB", "RGBA tiff 16-bit": "RGBA",
}  # fmt: skip
# a lossless WebP whose alpha is opaque everywhere: Pillow 13 (libwebp 1.6) opens it as RGB, the
# alpha channel left out of the file; earlier versions as RGBA
OPAQUE_OPENS_AS = {"RGBA webp lossless": {"RGBA", "RGB"}}
# modes of images that no file opens as (Pillow makes them in memory): read from a conversion
IN_MEMORY = {"La": "LA", "RGBa": "RGBA", "RGBX": "RGB", "HSV": "RGB", "I;16L": "I;16", "I;16N": "I;16"}
# 8-bit modes read by Pillow's conversion, checked against the image they came from
CONVERTED = ("YCbCr", "LAB")

pictures = arrays(np.uint8, st.tuples(st.integers(1, 7), st.integers(1, 7), st.just(4)))


def to_lossy_mode(rgb, mode):
    """An RGB image in one of the modes whose round trip from RGB loses levels."""
    if mode == "LAB":
        srgb, lab = ImageCms.createProfile("sRGB"), ImageCms.createProfile("LAB")
        return ImageCms.applyTransform(rgb, ImageCms.buildTransformFromOpenProfiles(srgb, lab, "RGB", "LAB"))
    return rgb.convert(mode)


@pytest.fixture(scope="module")
def round_trip_loss():
    """The most levels that reading an image of each lossy mode loses against the RGB image it
    was made from, over all 2**24 colours (so no random picture can find a larger one)."""
    index = np.arange(1 << 24, dtype=np.uint32)
    every = np.stack([index >> 16, (index >> 8) & 255, index & 255], -1).astype(np.uint8)
    every = every.reshape(4096, 4096, 3)
    loss = {}
    for mode in ("HSV", *CONVERTED):
        got = to_square_rgb(to_lossy_mode(Image.fromarray(every), mode), 4096)
        loss[mode] = int(np.abs(got.astype(np.int16) - every).max())
    return loss


def test_lossy_modes_lose_a_few_levels(round_trip_loss):
    """The tolerances below are these measured maxima; a reading that lost more (a wrong
    conversion path) would show here: 8-bit hue and saturation lose a few levels, LAB more."""
    assert round_trip_loss["HSV"] <= 8 and round_trip_loss["YCbCr"] <= 3 and round_trip_loss["LAB"] <= 48


def old_to_square_rgb(image, size):
    """The reading of 8-bit images before the mode rule (kept as it was)."""
    image = image.convert("RGBA")
    width, height = image.size
    side = max(width, height)
    canvas = Image.new("RGBA", (side, side), (255, 255, 255, 255))
    canvas.alpha_composite(image, ((side - width) // 2, (side - height) // 2))
    rgb = canvas.convert("RGB")
    if side != size:
        rgb = rgb.resize((size, size), Image.Resampling.LANCZOS)
    return np.asarray(rgb, dtype=np.uint8)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("modes")


def read(folder, data, suffix, size):
    path = folder / f"image{suffix}"
    path.write_bytes(data)
    return render_file(path, size)


def test_every_mode_is_covered():
    """Every mode Pillow knows is tested here: by a file, in memory, or as a conversion."""
    covered = set(OPENS_AS.values()) | set(IN_MEMORY) | set(CONVERTED) | set(DEEP_RANGES)
    assert set(Image.MODES) <= covered, sorted(set(Image.MODES) - covered)
    assert set(CASES) == set(OPENS_AS)


@pytest.mark.parametrize("case", sorted(CASES))
@FAST
@given(picture=pictures)
def test_each_mode_reads_as_its_8_bit_copy(folder, case, picture):
    write, suffix, reference = CASES[case]
    data = write(picture)
    opaque = bool((picture[..., 3] == 255).all())
    with Image.open(io.BytesIO(data)) as image:
        assert image.mode in (OPAQUE_OPENS_AS.get(case, set()) if opaque else set()) | {OPENS_AS[case]}
        size = max(image.size)
        old = old_to_square_rgb(image, size) if image.mode not in DEEP_RANGES else None
    got = read(folder, data, suffix, size)
    expected = read(folder, encode(reference(picture), "PNG"), ".png", size)
    assert got.shape == (size, size, 3) and got.dtype == np.uint8
    assert np.abs(got.astype(int) - expected).max() <= 1, case
    if old is not None:  # an 8-bit mode: read exactly as before
        np.testing.assert_array_equal(got, old)


@FAST
@given(picture=pictures, orientation=st.integers(1, 8))
def test_exif_orientation_turns_the_image_upright(folder, picture, orientation):
    upright = rgb_image(picture)
    size = max(upright.size)
    got = read(folder, png_with_exif(upright, orientation), ".png", size)
    np.testing.assert_array_equal(got, read(folder, encode(upright, "PNG"), ".png", size))


@FAST
@given(picture=pictures)
def test_modes_made_in_memory_and_conversions(round_trip_loss, picture):
    size = max(picture.shape[:2])
    rgba = Image.fromarray(picture)
    for mode, base in IN_MEMORY.items():
        source = {"LA": grey_alpha_image(picture).convert("LA"), "RGBA": rgba, "RGB": rgb_image(picture)}
        source["I;16"] = Image.fromarray(u16(grey_of(picture)))
        image = source[base].convert(mode) if mode not in ("I;16L", "I;16N") else source[base]
        if mode in ("I;16L", "I;16N"):
            image = Image.frombytes(mode, image.size, u16(grey_of(picture)).astype("<u2").tobytes())
        expected = to_square_rgb(source[base], size)
        tolerance = round_trip_loss.get(mode, 1)
        assert np.abs(to_square_rgb(image, size).astype(int) - expected).max() <= tolerance, mode
    for mode in CONVERTED:
        image = to_lossy_mode(rgb_image(picture), mode)
        got = to_square_rgb(image, size)
        np.testing.assert_array_equal(got, old_to_square_rgb(image, size))  # Pillow's conversion, as before
        loss = np.abs(got.astype(int) - to_square_rgb(rgb_image(picture), size)).max()
        assert loss <= round_trip_loss[mode], mode


def test_16_bit_png_is_scaled_not_clipped(folder):
    """The reported case: a 16-bit grey PNG read 95 % white where its 8-bit copy has no white."""
    grey = np.tile(np.arange(0, 250, 10, dtype=np.uint8), (25, 1))
    deep = read(folder, encode(Image.fromarray(u16(grey)), "PNG"), ".png", 25)
    eight = read(folder, encode(Image.fromarray(grey), "PNG"), ".png", 25)
    assert (eight == 255).mean() == 0 and (deep == 255).mean() == 0
    np.testing.assert_array_equal(deep, eight)


def test_float_values_outside_the_range_are_clipped_and_nan_is_transparent(folder):
    values = np.array([[-0.5, 0.0, 0.5, 1.0, 7.0, np.nan]], dtype=np.float32)
    got = read(folder, encode(Image.fromarray(values), "TIFF"), ".tiff", 6)[2, :, 0]  # the middle row
    np.testing.assert_array_equal(got, [0, 0, 128, 255, 255, 255])


@FAST
@given(
    picture=pictures, fmt=st.sampled_from(["PNG", "GIF", "TIFF", "BMP", "WEBP", "JPEG"]), cut=st.floats(0, 1)
)
def test_a_cut_short_file_is_named_or_read_whole(folder, picture, fmt, cut):
    """A file cut anywhere is a ValueError naming it and saying what to do, or (where the
    format can do without its end) an image of the right shape; never another error."""
    image = rgb_image(picture) if fmt != "GIF" else palette_image(picture[..., :3])
    data = encode(image, fmt)
    path = folder / f"cut.{fmt.lower()}"
    path.write_bytes(data[: int(cut * (len(data) - 1))])
    try:
        got = render_file(path, 8)
    except ValueError as e:
        assert f"cannot read the image {path}" in str(e) and "replace it" in str(e)
    else:
        assert got.shape == (8, 8, 3) and got.dtype == np.uint8


@FAST
@given(
    data=st.binary(max_size=64) | st.text(max_size=64).map(str.encode),
    suffix=st.sampled_from([".png", ".svg"]),
)
def test_a_file_that_is_not_an_image_is_named(folder, data, suffix):
    path = folder / f"noise{suffix}"
    path.write_bytes(data)
    try:
        got = render_file(path, 8)
    except ValueError as e:
        assert f"cannot read the image {path}" in str(e) and "remove it" in str(e)
    else:
        assert got.shape == (8, 8, 3)


def test_an_image_folder_of_every_mode_reads_as_its_8_bit_copy(tmp_path):
    """Through ``load_image_folder``: one class folder per case (TIFF files are images too)."""
    rng = np.random.default_rng(0)
    deep, eight = tmp_path / "deep", tmp_path / "eight"
    for case, (write, suffix, reference) in sorted(CASES.items()):
        for i in range(2):
            picture = rng.integers(0, 256, (5, 6, 4), dtype=np.uint8)
            for root, data, ext in (
                (deep, write(picture), suffix),
                (eight, encode(reference(picture), "PNG"), ".png"),
            ):
                target = root / case.replace(" ", "_") / f"{i}{ext}"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
    got, expected = load_image_folder(deep, 6, workers=1), load_image_folder(eight, 6, workers=1)
    assert list(got.class_names) == list(expected.class_names) and len(got.images) == 2 * len(CASES)
    assert np.abs(got.images.astype(int) - expected.images).max() <= 1
