"""Build an image folder of letters drawn by many typefaces, for ``pml-fieldlosses bench --data``.

    python benchmarks/make_glyph_folder.py --out /work/data/glyphs
    pml-fieldlosses bench --data /work/data/glyphs ...

One class per letter (Unicode categories Lu, Ll, Lt, Lo of the Latin, Latin
Extended, Cyrillic, Cyrillic Extended and Greek ranges of Google Fonts), one
64 x 64 RGB PNG per font that contains it: ``OUT/<class>/<font id>-<style>.png``,
black on white. The fonts are the Google Fonts families that cover Latin, Latin
Extended, Cyrillic and either Greek or Cyrillic Extended, at weight 400, upright
and, where the family has one, italic. Left out: small-caps and unicase families
(by name) and fonts that do not draw a-z, A-Z as distinct letters (Flow's
placeholder blocks, Kablammo; see ``is_text_font``).

Sources, npm registry only: ``google-font-metadata`` (pinned) lists the families,
their subsets and unicode ranges and their licences; ``@fontsource/<id>`` (the
version current when first fetched) holds each family's woff2 files, one per
subset. Tarballs are fetched with ``npm pack`` and verified (npm's report, the
registry's metadata, the pinned integrity) by ``pml_fieldlosses.app.datasets.npm``,
and kept under ``--cache`` with the versions resolved (``packages.json``), so a
rerun downloads nothing.

Rendering (Pillow's FreeType, no shaping): each font is drawn at the size that
makes its capital H ``CAP_HEIGHT`` px tall, so that case and proportions survive
(o and O differ in size); a glyph larger than ``BOX`` px either way is drawn
smaller until it fits. The glyph is centred by its ink bounding box. A letter is
missing from a font where its render is blank or equals the render of U+10FFFD
(a code point no font has: FreeType draws the font's .notdef glyph for it).

Clean-up: within one font, a letter drawn like a letter of lower code point
loses its image (Latin A, Greek Alpha and Cyrillic A are often one glyph, or
one outline hinted a pixel apart; see ``drop_look_alikes``), so look-alike
letters do not form classes that no model could tell apart; within one class,
an image identical to one of an earlier font (families sharing a design) is
dropped. Classes with at least
``--min-per-class`` images are kept, the ``--max-classes`` largest of them, and
at most ``--max-per-class`` images each (a fixed choice by hash).

Class folders are named ``<first 6 hex digits of sha1(letter)>-U+XXXX``: the
bench sorts classes by folder name and trains on the first half, so this mixes
scripts and cases on both sides. ``OUT/MANIFEST.json`` records the packages,
fonts, licences, settings and per-class counts; ``OUT/README.txt`` says what
the folder is.
"""

import argparse
import hashlib
import io
import json
import multiprocessing
import shlex
import shutil
import statistics
import string
import sys
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tqdm
from PIL import Image, ImageDraw, ImageFont

from pml_fieldlosses.app.datasets.npm import NpmPackage, npm_pack, run_npm, safe_extract, sha512_integrity

METADATA = NpmPackage(
    "google-font-metadata",
    "6.0.8",
    "sha512-6P2rhlrV0AoTTMrEf+1h7azRjQiMMcZ8RpV+NuxGPaOKhwwpbqsE3HsQY01PYYa/KJbf6UxuyVlcVVGzK3ywfw==",
)
REQUIRED_SUBSETS = ("latin", "latin-ext", "cyrillic")  # a family must have all of these
EXTENDED_SUBSETS = ("greek", "cyrillic-ext")  # and one of these
SUBSETS = ("latin", "latin-ext", "cyrillic", "cyrillic-ext", "greek")  # where the letters come from
LETTER_CATEGORIES = ("Lu", "Ll", "Lt", "Lo")  # not Lm: modifier letters are marks (ʼ ˆ ʰ)
WEIGHT = 400
STYLES = ("normal", "italic")
IMAGE_SIZE = 64
BOX = 56  # the largest glyph side, in px
CAP_HEIGHT = 38  # the height of each font's capital H, in px
MISSING = "\U0010fffd"  # a code point no font maps: its render is the font's .notdef glyph
BASIC_LETTERS = string.ascii_letters
MIN_DISTINCT_BASIC = 50  # a text font draws a-z, A-Z as at least this many distinct images
MIN_ALIKE_FONTS = 3  # two letters drawn pixel for pixel alike in this many fonts are look-alikes
ALIKE_TOLERANCE = 0.1  # look-alikes whose renders differ in less than this share of ink pixels
# the names that licenses.json uses, for the SPDX ids of the @fontsource packages
LICENSE_NAMES = {
    "OFL-1.1": "SIL Open Font License, 1.1",
    "Apache-2.0": "Apache License, Version 2.0",
    "UFL-1.0": "Ubuntu Font License, 1.0",
}


def parse_unicode_range(text):
    """The code points of a CSS unicode-range string such as ``"U+0000-00FF,U+0131"``."""
    points = set()
    for part in text.split(","):
        part = part.strip().upper().removeprefix("U+")
        first, _, last = part.partition("-")
        points.update(range(int(first, 16), int(last or first, 16) + 1))
    return points


def fetch_tarball(name, version, cache, resolved, npm="npm"):
    """The verified tarball of npm package ``name`` under ``cache/tarballs``.
    ``version`` None: the version recorded in ``resolved`` ({name: {version,
    integrity, tarball}}, updated here), else the registry's current one (None
    if the registry has no such package). A cached tarball is reused when its
    sha512 matches the recorded integrity."""
    record = resolved.get(name)
    if record and version in (None, record["version"]):
        tarball = Path(cache) / "tarballs" / record["tarball"]
        if tarball.is_file() and sha512_integrity(tarball) == record["integrity"]:
            return tarball
    if version is None:
        try:
            version = json.loads(run_npm(["view", "--json", name, "version"], npm=npm))
        except RuntimeError as e:
            if "E404" in str(e):
                return None
            raise
    pinned = METADATA.integrity if name == METADATA.name else None
    tarball = npm_pack(NpmPackage(name, version, pinned), Path(cache) / "tarballs", npm=npm)
    resolved[name] = {"version": version, "integrity": sha512_integrity(tarball), "tarball": tarball.name}
    return tarball


def choose_families(fonts):
    """Ids of the families with every REQUIRED_SUBSETS subset and one of
    EXTENDED_SUBSETS, weight 400 upright, and true lower case (no small-caps
    family, whose name ends in " SC", and no unicase one)."""
    return sorted(
        font_id
        for font_id, font in fonts.items()
        if set(REQUIRED_SUBSETS) <= set(font["subsets"])
        and set(EXTENDED_SUBSETS) & set(font["subsets"])
        and WEIGHT in [int(w) for w in font["weights"]]
        and "normal" in font["styles"]
        and not font["family"].endswith(" SC")
        and "Unicase" not in font["family"]
    )


def subset_ranges(font):
    """{subset: set of code points} of a family's SUBSETS."""
    return {s: parse_unicode_range(font["unicodeRange"][s]) for s in SUBSETS if s in font["subsets"]}


def candidate_letters(fonts, families):
    """The letters (LETTER_CATEGORIES) of the SUBSETS ranges of ``families``, in code point order."""
    points = set().union(*(set().union(*subset_ranges(fonts[f]).values()) for f in families))
    return [chr(p) for p in sorted(points) if unicodedata.category(chr(p)) in LETTER_CATEGORIES]


def extract_fonts(tarball, font_id, font, dest):
    """Unpack the woff2 files of ``font_id`` (SUBSETS, weight 400, STYLES), its
    LICENSE and metadata.json into ``dest/font_id``. Returns ({style: [(subset,
    path)]}, {file: sha256}, the package's metadata)."""
    names = {
        f"package/files/{font_id}-{subset}-{WEIGHT}-{style}.woff2": (style, subset)
        for style in STYLES
        if style in font["styles"]
        for subset in SUBSETS
        if subset in font["subsets"]
    }
    folder = Path(dest) / font_id
    shutil.rmtree(folder, ignore_errors=True)
    extra = ("package/LICENSE", "package/metadata.json")
    hashes = safe_extract(tarball, folder, select=lambda n: n in names or n in extra)
    files = {}
    for name, (style, subset) in names.items():
        if name in hashes:
            files.setdefault(style, []).append((subset, str(folder / name)))
    return files, hashes, json.loads((folder / "package" / "metadata.json").read_text())


def license_of(font_id, licenses, package_meta):
    """A family's licence as google-font-metadata's licenses.json names it, else
    (licenses.json lacks some families) as the @fontsource package's metadata.json does."""
    if font_id in licenses:
        return licenses[font_id]["license"]["type"]
    stated = package_meta.get("license", "unknown")
    stated = stated["type"] if isinstance(stated, dict) else stated
    return LICENSE_NAMES.get(stated, stated)


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
    """Render every letter of ``job`` = (font key, [(subset, woff2 path, code
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


def class_folder(char):
    """Folder name of a letter's class: sorts by a hash, so that scripts and cases mix."""
    return f"{hashlib.sha1(char.encode()).hexdigest()[:6]}-U+{ord(char):04X}"


def select_images(rendered, min_per_class, max_classes, max_per_class):
    """From {font key: {letter: PNG bytes}}: drop repeats of an image within a class
    (the font key first in sorted order keeps it), keep the letters with at least
    ``min_per_class`` images, the ``max_classes`` with most, and at most
    ``max_per_class`` images of each (the lowest sha1 of letter and font key).
    Returns ({letter: {font key: PNG bytes}}, number of repeats dropped)."""
    by_letter, seen, repeats = {}, {}, 0
    for key in sorted(rendered):
        for char, png in rendered[key].items():
            if png in seen.setdefault(char, set()):
                repeats += 1
            else:
                seen[char].add(png)
                by_letter.setdefault(char, {})[key] = png
    large = [c for c, images in by_letter.items() if len(images) >= min_per_class]
    large = sorted(large, key=lambda c: (-len(by_letter[c]), ord(c)))[:max_classes]
    chosen = {}
    for char in sorted(large):
        keys = sorted(by_letter[char], key=lambda k: hashlib.sha1(f"{char}/{k}".encode()).hexdigest())
        chosen[char] = {k: by_letter[char][k] for k in sorted(keys[:max_per_class])}
    return chosen, repeats


def write_folder(out, chosen, manifest, readme):
    """Write the class folders, MANIFEST.json and README.txt into ``out`` via
    ``out.part`` (renamed at the end, so that a stopped run leaves no folder that looks complete)."""
    part = out.with_name(out.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    for char, images in tqdm.tqdm(chosen.items(), desc="writing", unit="class", leave=False):
        folder = part / class_folder(char)
        folder.mkdir(parents=True)
        for key, png in images.items():
            (folder / f"{key}.png").write_bytes(png)
    (part / "MANIFEST.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False))
    (part / "README.txt").write_text(readme)
    part.rename(out)


def readme_text(manifest):
    """The folder's README.txt."""
    counts = manifest["images_per_class"]
    return f"""Letters drawn by many typefaces: an image folder for `pml-fieldlosses bench --data`.

{manifest["num_classes"]} classes, one per letter of the Latin, Latin Extended, Cyrillic (Extended) and
Greek ranges of Google Fonts; {manifest["num_images"]} images ({counts["min"]} to {counts["max"]} per class, median
{counts["median"]:g}) from {manifest["num_fonts"]} fonts: {len(manifest["fonts"])} Google Fonts families at weight {WEIGHT},
upright and (where the family has one) italic. Each image is one letter in one font, a
{IMAGE_SIZE} x {IMAGE_SIZE} RGB PNG, black on white: the font drawn at the size that makes its capital H
{CAP_HEIGHT} px tall (glyphs larger than {BOX} px made smaller), centred by its ink. Files are
<class>/<font id>-<style>.png; class folders are <sha1(letter)[:6]>-U+XXXX, so that the bench's
first-half training classes mix scripts and cases. In each font, a letter drawn like a letter
of lower code point (Cyrillic a like Latin a) has no image; within a class, repeated images
(families sharing a design) are kept once.

Made by benchmarks/make_glyph_folder.py of pml-fieldlosses:
    {manifest["command"]}
from the npm packages google-font-metadata and @fontsource/<font id> (versions and integrity
in MANIFEST.json, which also lists every font, its licence, and the letter of every class).
The fonts are under the SIL Open Font License 1.1, the Apache License 2.0 or the Ubuntu
Font Licence 1.0 (per family in MANIFEST.json); these images are renderings of them.
"""


def fetch_fonts(cache, npm):
    """Fetch the metadata and the families' packages (``fetch_tarball``) and unpack
    their fonts under ``cache``. Returns (render jobs for ``render_font``, {font id:
    record for the manifest}, {package: {version, integrity, tarball}}, the
    families that have no @fontsource package, the candidate letters)."""
    record_path = cache / "packages.json"
    resolved = json.loads(record_path.read_text()) if record_path.is_file() else {}
    tarball = fetch_tarball(METADATA.name, METADATA.version, cache, resolved, npm)
    data = ("package/data/google-fonts-v2.json", "package/data/licenses.json")
    safe_extract(tarball, cache / "metadata", select=lambda name: name in data)
    fonts, licenses = (json.loads((cache / "metadata" / name).read_text()) for name in data)
    families = choose_families(fonts)
    with ThreadPoolExecutor(4) as pool:
        fetched = pool.map(lambda f: fetch_tarball(f"@fontsource/{f}", None, cache, resolved, npm), families)
        tarballs = dict(zip(families, tqdm.tqdm(fetched, total=len(families), desc="npm", unit="package")))
    record_path.write_text(json.dumps(resolved, indent=1, sort_keys=True))
    not_on_npm = [font_id for font_id, tarball in tarballs.items() if tarball is None]
    families = [font_id for font_id in families if font_id not in not_on_npm]
    letters = candidate_letters(fonts, families)
    jobs, records = [], {}
    for font_id in families:
        files, hashes, package_meta = extract_fonts(
            tarballs[font_id], font_id, fonts[font_id], cache / "fonts"
        )
        ranges = subset_ranges(fonts[font_id])
        for style, subset_files in files.items():
            jobs.append((f"{font_id}-{style}", [(s, p, ranges[s]) for s, p in subset_files], letters))
        records[font_id] = {
            "family": fonts[font_id]["family"],
            "category": fonts[font_id]["category"],
            "styles": sorted(files),
            "license": license_of(font_id, licenses, package_meta),
            "package": f"@fontsource/{font_id}@{resolved[f'@fontsource/{font_id}']['version']}",
            "files_sha256": {name.removeprefix("package/"): h for name, h in sorted(hashes.items())},
        }
    return jobs, records, resolved, not_on_npm, letters


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to create (must not exist)")
    parser.add_argument(
        "--cache", type=Path, default=Path("/work/data/glyph-cache"), help="npm tarballs and unpacked fonts"
    )
    parser.add_argument("--max-classes", type=int, default=1000)
    parser.add_argument("--max-per-class", type=int, default=250)
    parser.add_argument("--min-per-class", type=int, default=60)
    parser.add_argument("--workers", type=int, default=multiprocessing.cpu_count(), help="render processes")
    parser.add_argument("--npm", default="npm", help="the npm client")
    args = parser.parse_args(argv)
    if args.out.exists():
        parser.error(f"{args.out} exists; remove it first")
    start = time.time()
    args.cache.mkdir(parents=True, exist_ok=True)
    jobs, records, resolved, not_on_npm, letters = fetch_fonts(args.cache, args.npm)
    print(f"{len(records)} families, {len(jobs)} fonts, {len(letters)} candidate letters")
    if not_on_npm:
        print(f"no @fontsource package (left out): {', '.join(not_on_npm)}")

    with multiprocessing.Pool(args.workers) as pool:
        results = pool.imap_unordered(render_font, jobs)
        rendered = dict(tqdm.tqdm(results, total=len(jobs), desc="rendering", unit="font"))
    not_text = sorted(key for key, images in rendered.items() if not is_text_font(images))
    if not_text:
        print(f"not text fonts (left out): {', '.join(not_text)}")
    for key in not_text:
        del rendered[key]
        font_id, style = key.rsplit("-", 1)
        records[font_id]["styles"].remove(style)
    records = {font_id: record for font_id, record in records.items() if record["styles"]}
    rendered, alike = drop_look_alikes(rendered)
    chosen, repeats = select_images(rendered, args.min_per_class, args.max_classes, args.max_per_class)
    if len(chosen) < 4:
        sys.exit(f"only {len(chosen)} letters have {args.min_per_class} images; lower --min-per-class")

    counts = [len(images) for images in chosen.values()]
    manifest = {
        "description": "letters drawn by many typefaces; one class per letter, one image per font",
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "settings": {
            "subsets": SUBSETS,
            "letter_categories": LETTER_CATEGORIES,
            "weight": WEIGHT,
            "image_size": IMAGE_SIZE,
            "cap_height_px": CAP_HEIGHT,
            "box_px": BOX,
            "min_alike_fonts": MIN_ALIKE_FONTS,
            "alike_tolerance": ALIKE_TOLERANCE,
            "min_per_class": args.min_per_class,
            "max_classes": args.max_classes,
            "max_per_class": args.max_per_class,
        },
        "packages": [
            {"name": name, "version": r["version"], "integrity": r["integrity"]}
            for name, r in sorted(resolved.items())
            if name == METADATA.name or name.removeprefix("@fontsource/") in records
        ],
        "families_without_fontsource_package": not_on_npm,
        "fonts_left_out_as_not_text": not_text,
        "num_fonts": len(rendered),
        "fonts": records,
        "licenses": {font_id: record["license"] for font_id, record in records.items()},
        "num_candidate_letters": len(letters),
        "look_alike_images_dropped": alike,
        "repeated_images_dropped": repeats,
        "num_classes": len(chosen),
        "num_images": sum(counts),
        "images_per_class": {"min": min(counts), "median": statistics.median(counts), "max": max(counts)},
        "classes": {
            class_folder(c): {"letter": c, "name": unicodedata.name(c, ""), "images": len(images)}
            for c, images in sorted(chosen.items(), key=lambda item: class_folder(item[0]))
        },
    }
    write_folder(args.out, chosen, manifest, readme_text(manifest))
    print(
        f"{args.out}: {len(chosen)} classes, {sum(counts)} images ({min(counts)}-{max(counts)} per class, "
        f"median {statistics.median(counts)}) from {len(rendered)} fonts in {time.time() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
