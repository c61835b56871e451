"""Letters of a font drawn as 64 px images, and the clean-up of letters that fonts draw alike
(the drawing half of the ``glyphs`` data set, see glyphs.py).

Rendering (Pillow's FreeType, no shaping): each font is drawn at the size that makes
its capital H ``CAP_HEIGHT`` px tall, so that case and proportions survive (o and O
differ in size); a glyph larger than ``BOX`` px either way is drawn smaller until it
fits. The glyph is centred by its ink bounding box, black on white. A letter is missing
from a font where its render is blank or equals the render of U+10FFFD (a code point no
font has: FreeType draws the font's .notdef glyph for it). Images are kept as PNG bytes:
equal bytes are equal images, which is how repeats are found.
"""

import io
import string

import numpy as np
import tqdm
from PIL import Image, ImageDraw, ImageFont

IMAGE_SIZE = 64
BOX = 56  # the largest glyph side, in px
CAP_HEIGHT = 38  # the height of each font's capital H, in px
MISSING = "\U0010fffd"  # a code point no font maps: its render is the font's .notdef glyph
BASIC_LETTERS = string.ascii_letters
MIN_DISTINCT_BASIC = 50  # a text font draws a-z, A-Z as at least this many distinct images
MIN_ALIKE_FONTS = 3  # two letters drawn pixel for pixel alike in this many fonts are look-alikes
ALIKE_TOLERANCE = 0.1  # look-alikes whose renders differ in less than this share of ink pixels


def ink(font, char):
    """The glyph of ``char`` as a uint8 coverage array cropped to its ink, or None
    if blank or if FreeType cannot draw it (one glyph of Rubik Pixels: "invalid outline")."""
    margin = 2
    try:
        left, top, right, bottom = font.getbbox(char)
        canvas = Image.new("L", (right - left + 2 * margin, bottom - top + 2 * margin), 0)
        ImageDraw.Draw(canvas).text((margin - left, margin - top), char, font=font, fill=255)
    except OSError:
        return None
    array = np.asarray(canvas)
    rows, cols = np.flatnonzero(array.any(axis=1)), np.flatnonzero(array.any(axis=0))
    if len(rows) == 0:
        return None
    return array[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]


def font_size(font_file):
    """The pixel size at which the capital H of ``font_file`` is CAP_HEIGHT px tall."""
    reference = 200
    height = ink(ImageFont.truetype(font_file, reference, layout_engine=ImageFont.Layout.BASIC), "H").shape[0]
    return max(1, round(reference * CAP_HEIGHT / height))


def to_png(glyph):
    """A coverage array centred on a white IMAGE_SIZE square, black ink, as RGB PNG bytes."""
    height, width = glyph.shape
    canvas = np.full((IMAGE_SIZE, IMAGE_SIZE), 255, dtype=np.uint8)
    top, left = (IMAGE_SIZE - height) // 2, (IMAGE_SIZE - width) // 2
    canvas[top : top + height, left : left + width] = 255 - glyph
    buffer = io.BytesIO()
    Image.fromarray(canvas).convert("RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def render_font(job):
    """Render every letter of ``job`` = (font key, [(subset, font file, code
    points)], letters) that the font has. Returns (font key, {letter: PNG bytes})."""
    key, files, letters = job
    size = font_size(next(path for subset, path, _ in files if subset == "latin"))
    loaded = []
    for _, path, points in files:
        font = ImageFont.truetype(path, size, layout_engine=ImageFont.Layout.BASIC)
        loaded.append((font, points, ink(font, MISSING)))
    images = {}
    for char in letters:
        for font, points, notdef in loaded:
            if ord(char) not in points:
                continue
            glyph = ink(font, char)
            if glyph is None or (notdef is not None and np.array_equal(glyph, notdef)):
                continue
            scaled = size
            while max(glyph.shape) > BOX:
                scaled = min(scaled - 1, int(scaled * BOX / max(glyph.shape)))
                glyph = ink(font.font_variant(size=scaled), char)
            images[char] = to_png(glyph)
            break
    return key, images


def is_text_font(images):
    """Whether a font's {letter: PNG bytes} draws a-z and A-Z as at least
    MIN_DISTINCT_BASIC distinct images (not so: placeholder fonts such as Flow
    Block, which draw blocks, and unicase fonts such as Kablammo)."""
    return len({images[c] for c in BASIC_LETTERS if c in images}) >= MIN_DISTINCT_BASIC


def decode(png):
    """Ink coverage (0 white .. 255 black) of a rendered PNG, as int16."""
    with Image.open(io.BytesIO(png)) as image:
        return 255 - np.asarray(image.convert("L"), dtype=np.int16)


def drawn_alike(a, b):
    """Whether two ink arrays show one drawing: at the best shift by up to one
    pixel, less than ALIKE_TOLERANCE of their ink pixels differ by more than half."""
    best = 1.0
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            shifted = np.roll(b, (dy, dx), axis=(0, 1))  # the glyph has a margin: nothing wraps round
            ink_pixels = np.count_nonzero((a > 128) | (shifted > 128))
            best = min(best, np.count_nonzero(np.abs(a - shifted) > 128) / max(ink_pixels, 1))
    return best < ALIKE_TOLERANCE


def drop_look_alikes(rendered):
    """Give each drawing of a font to one letter only: in every font, a letter
    drawn like a letter of lower code point loses its image. Drawn like: the same
    image, or, for two letters whose images are the same in MIN_ALIKE_FONTS fonts
    (Latin a and Cyrillic a), ``drawn_alike`` (the same outline, placed a pixel
    apart or hinted differently). Returns ({font key: {letter: PNG bytes}}, the
    number of images dropped)."""
    same_in = {}
    for images in rendered.values():
        letters_of = {}
        for char in sorted(images):
            letters_of.setdefault(images[char], []).append(char)
        for group in letters_of.values():
            for i, low in enumerate(group):
                for high in group[i + 1 :]:
                    same_in[low, high] = same_in.get((low, high), 0) + 1
    pairs = sorted(pair for pair, n in same_in.items() if n >= MIN_ALIKE_FONTS)
    kept, dropped = {}, 0
    for key, images in tqdm.tqdm(rendered.items(), desc="look-alikes", unit="font", leave=False):
        first = {}
        for char in sorted(images):
            first.setdefault(images[char], char)
        lose = {char for char, png in images.items() if first[png] != char}
        arrays = {}
        for low, high in pairs:
            if low in images and high in images and high not in lose:
                for char in (low, high):
                    if char not in arrays:
                        arrays[char] = decode(images[char])
                if drawn_alike(arrays[low], arrays[high]):
                    lose.add(high)
        kept[key] = {char: png for char, png in images.items() if char not in lose}
        dropped += len(lose)
    return kept, dropped
