"""Letters drawn by many typefaces: the same letter in different fonts is one class.

One class per letter (Unicode categories Lu, Ll, Lt, Lo of the Latin, Latin
Extended, Cyrillic, Cyrillic Extended and Greek ranges of Google Fonts), one image
per font that draws it, black on white (see glyph_render.py for the drawing). The
fonts are the Google Fonts families that cover Latin, Latin Extended, Cyrillic and
either Greek or Cyrillic Extended, at weight 400, upright and, where the family has
one, italic. Left out: small-caps and unicase families (by name) and fonts that do not
draw a-z, A-Z as distinct letters (Flow's placeholder blocks, Kablammo; see
``glyph_render.is_text_font``).

Built once from npm packages by the shared builder (``builder.py``): the pinned
``google-font-metadata`` lists the families, their subsets, unicode ranges and
licences; ``@fontsource/<font id>`` (pinned in glyph_fonts.py) holds each family's
woff2 files, one per subset. Clean-up: within one font, a letter drawn like a letter
of lower code point loses its image (Latin A, Greek Alpha and Cyrillic A are often one
glyph; see ``glyph_render.drop_look_alikes``); within one class, an image identical to
one of an earlier font (families sharing a design) is dropped. Classes with at least
``min_per_class`` images are kept, the ``max_classes`` largest of them, and at most
``max_per_class`` images each (a fixed choice by hash).

Classes are named and ordered ``<first 6 hex digits of sha1(letter)>-U+XXXX``, which
mixes scripts and cases on both sides of the first-half split; within a class the
images are in the order of their font key (``<font id>-<style>``, the image's source).
``write_glyph_folder`` writes the set as an image folder, one PNG per image.

The set: 918 classes, 146 918 images (60 to 250 per class, median 142) from 286 fonts
of 196 families (283 of the fonts keep images); see docs/data.md.
"""

import hashlib
import json
import os
import shutil
import statistics
import unicodedata
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import tqdm
from PIL import Image

from ..errors import file_fault
from . import glyph_render
from .base import ImageSet, first_half_split
from .builder import fetch_package, fetch_packages, load_or_build
from .cache import cache_dir
from .glyph_fonts import FONT_LICENSES, FONT_PACKAGES, LICENSE_NAMES
from .npm import NpmPackage, find_npm
from .render import render_image, to_square_rgb

# bump when the build's output for the same inputs changes
BUILD_VERSION = 1

METADATA = NpmPackage(
    "google-font-metadata",
    "6.0.8",
    "sha512-6P2rhlrV0AoTTMrEf+1h7azRjQiMMcZ8RpV+NuxGPaOKhwwpbqsE3HsQY01PYYa/KJbf6UxuyVlcVVGzK3ywfw==",
)
PACKAGES = {METADATA.name: METADATA, **{p.name: p for p in FONT_PACKAGES.values()}}
REQUIRED_SUBSETS = ("latin", "latin-ext", "cyrillic")  # a family must have all of these
EXTENDED_SUBSETS = ("greek", "cyrillic-ext")  # and one of these
SUBSETS = ("latin", "latin-ext", "cyrillic", "cyrillic-ext", "greek")  # where the letters come from
LETTER_CATEGORIES = ("Lu", "Ll", "Lt", "Lo")  # not Lm: modifier letters are marks (ʼ ˆ ʰ)
WEIGHT = 400
STYLES = ("normal", "italic")
DEFAULT_MIN_PER_CLASS = 60
DEFAULT_MAX_CLASSES = 1000
DEFAULT_MAX_PER_CLASS = 250
# image licences by source (font key): a rendering of a font is under the font's licence
LICENSES = {f"{font_id}-{style}": FONT_LICENSES[font_id] for font_id in FONT_PACKAGES for style in STYLES}


def parse_unicode_range(text):
    """The code points of a CSS unicode-range string such as ``"U+0000-00FF,U+0131"``."""
    points = set()
    for part in text.split(","):
        part = part.strip().upper().removeprefix("U+")
        first, _, last = part.partition("-")
        points.update(range(int(first, 16), int(last or first, 16) + 1))
    return points


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


def font_files(font_id, font):
    """{file in the @fontsource tarball: (style, subset)}: the woff2 files of ``font_id``
    for SUBSETS at WEIGHT in STYLES."""
    return {
        f"package/files/{font_id}-{subset}-{WEIGHT}-{style}.woff2": (style, subset)
        for style in STYLES
        if style in font["styles"]
        for subset in SUBSETS
        if subset in font["subsets"]
    }


def license_of(font_id, licenses, package_meta):
    """A family's licence as google-font-metadata's licenses.json names it, else
    (licenses.json lacks some families) as the @fontsource package's metadata.json does."""
    if font_id in licenses:
        return licenses[font_id]["license"]["type"]
    stated = package_meta.get("license", "unknown")
    stated = stated["type"] if isinstance(stated, dict) else stated
    return LICENSE_NAMES.get(stated, stated)


def class_folder(char):
    """A letter's class name: sorts by a hash, so that scripts and cases mix."""
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


def fetch_metadata(root, packages, npm):
    """google-font-metadata's {font id: family} and {font id: licence record}."""
    data = ("package/data/google-fonts-v2.json", "package/data/licenses.json")
    folder, _ = fetch_package(packages[METADATA.name], root, data, npm)
    return [json.loads((folder / name).read_text()) for name in data]


def fetch_fonts(root, fonts, licenses, families, packages, npm):
    """Fetch the @fontsource package of each of ``families`` (4 at a time) and list
    their font files. Returns (render jobs for ``glyph_render.render_font``, {font id:
    record}, the candidate letters)."""

    wanted = {
        font_id: (
            packages[f"@fontsource/{font_id}"],
            (*font_files(font_id, fonts[font_id]), "package/LICENSE", "package/metadata.json"),
        )
        for font_id in families
    }
    fetched = fetch_packages(wanted, root, npm, workers=4, progress="npm")
    letters = candidate_letters(fonts, families)
    jobs, records = [], {}
    for font_id in families:
        folder, hashes = fetched[font_id]
        files = {}
        for name, (style, subset) in font_files(font_id, fonts[font_id]).items():
            if name in hashes:
                files.setdefault(style, []).append((subset, str(folder / name)))
        ranges = subset_ranges(fonts[font_id])
        for style, subset_files in files.items():
            jobs.append((f"{font_id}-{style}", [(s, p, ranges[s]) for s, p in subset_files], letters))
        package_meta = json.loads((folder / "package" / "metadata.json").read_text())
        licence = license_of(font_id, licenses, package_meta)
        pinned = FONT_PACKAGES.get(font_id)
        if pinned == packages[f"@fontsource/{font_id}"] and licence != FONT_LICENSES[font_id]:
            raise ValueError(
                f"{pinned.spec} has the licence {licence!r}; glyph_fonts.py says {FONT_LICENSES[font_id]!r}"
            )
        records[font_id] = {
            "family": fonts[font_id]["family"],
            "category": fonts[font_id]["category"],
            "styles": sorted(files),
            "license": licence,
            "package": packages[f"@fontsource/{font_id}"].spec,
            "files_sha256": {name.removeprefix("package/"): h for name, h in sorted(hashes.items())},
        }
    return jobs, records, letters


def render_fonts(jobs, workers):
    """{font key: {letter: PNG bytes}} of every render job, in ``workers`` processes."""
    bar = dict(total=len(jobs), desc="rendering fonts", unit="font", leave=False)
    if workers == 1:
        return dict(tqdm.tqdm(map(glyph_render.render_font, jobs), **bar))
    with ProcessPoolExecutor(workers) as pool:
        return dict(tqdm.tqdm(pool.map(glyph_render.render_font, jobs), **bar))


def describe(chosen, records, packages, min_per_class, max_classes, max_per_class):
    """The build record's description of the set: settings, packages, fonts, licences, classes."""
    counts = [len(images) for images in chosen.values()]
    return {
        "description": "letters drawn by many typefaces; one class per letter, one image per font",
        "settings": {
            "subsets": SUBSETS,
            "letter_categories": LETTER_CATEGORIES,
            "weight": WEIGHT,
            "image_size": glyph_render.IMAGE_SIZE,
            "cap_height_px": glyph_render.CAP_HEIGHT,
            "box_px": glyph_render.BOX,
            "min_alike_fonts": glyph_render.MIN_ALIKE_FONTS,
            "alike_tolerance": glyph_render.ALIKE_TOLERANCE,
            "min_per_class": min_per_class,
            "max_classes": max_classes,
            "max_per_class": max_per_class,
        },
        "packages": [
            {"name": p.name, "version": p.version, "integrity": p.integrity}
            for p in [packages[METADATA.name]] + [packages[f"@fontsource/{f}"] for f in records]
        ],
        "fonts": records,
        "licenses": {font_id: record["license"] for font_id, record in records.items()},
        "images_per_class": {"min": min(counts), "median": statistics.median(counts), "max": max(counts)},
        "classes": {
            class_folder(c): {"letter": c, "name": unicodedata.name(c, ""), "images": len(images)}
            for c, images in sorted(chosen.items(), key=lambda item: class_folder(item[0]))
        },
    }


def build_glyphs(root, families, packages, npm, workers, min_per_class, max_classes, max_per_class):
    """Fetch, render and select the glyphs. Returns ({letter: {font key: PNG bytes}},
    the build's record: packages, fonts and their licences, settings, counts)."""
    fonts, licenses = fetch_metadata(root, packages, npm)
    chosen_families = choose_families(fonts)
    if families is not None:
        chosen_families = [f for f in chosen_families if f in families]
    not_on_npm = [f for f in chosen_families if f"@fontsource/{f}" not in packages]
    chosen_families = [f for f in chosen_families if f not in not_on_npm]
    jobs, records, letters = fetch_fonts(root, fonts, licenses, chosen_families, packages, npm)
    rendered = render_fonts(jobs, workers)
    not_text = sorted(key for key, images in rendered.items() if not glyph_render.is_text_font(images))
    for key in not_text:
        del rendered[key]
        font_id, style = key.rsplit("-", 1)
        records[font_id]["styles"].remove(style)
    records = {font_id: record for font_id, record in records.items() if record["styles"]}
    rendered, alike = glyph_render.drop_look_alikes(rendered)
    chosen, repeats = select_images(rendered, min_per_class, max_classes, max_per_class)
    if len(chosen) < 4:
        raise ValueError(f"only {len(chosen)} letters have {min_per_class} images; lower min_per_class")
    record = describe(chosen, records, packages, min_per_class, max_classes, max_per_class)
    record.update(
        families_without_fontsource_package=not_on_npm,
        fonts_left_out_as_not_text=not_text,
        num_fonts=len(rendered),
        num_candidate_letters=len(letters),
        look_alike_images_dropped=alike,
        repeated_images_dropped=repeats,
    )
    return chosen, record


def as_image_set(chosen):
    """The ImageSet of {letter: {font key: PNG bytes}} at 64 px: classes in the order of
    their ``class_folder`` name, images in the order of their font key."""
    letters = sorted(chosen, key=class_folder)
    order = [(c, key) for c in letters for key in sorted(chosen[c], key=lambda k: f"{k}.png")]
    size = glyph_render.IMAGE_SIZE
    images = np.empty((len(order), size, size, 3), dtype=np.uint8)  # 1.7 GiB for the full set: no copies
    for i, (char, key) in enumerate(order):
        images[i] = render_image(chosen[char][key], size)
    labels = np.repeat(np.arange(len(letters)), [len(chosen[c]) for c in letters])
    names = [class_folder(c) for c in letters]
    sources = [key for _, key in order]
    return ImageSet(images, labels, names, sources, first_half_split(len(names)), "glyphs")


def resized(data, image_size):
    """``data`` with every image resized (LANCZOS), as an image folder of its PNGs would read."""
    images = np.empty((len(data.images), image_size, image_size, 3), dtype=np.uint8)
    for i, image in enumerate(data.images):
        images[i] = to_square_rgb(Image.fromarray(image), image_size)
    return ImageSet(images, data.labels, data.class_names, data.sources, data.num_train_classes, data.name)


# what selects the glyph set (the options of load_glyphs beside the size and the cache)
SELECTION = dict(
    packages=None,  # {name: NpmPackage} replacing pinned packages (tests)
    families=None,  # only these font ids (a small set, for tests)
    min_per_class=DEFAULT_MIN_PER_CLASS,
    max_classes=DEFAULT_MAX_CLASSES,
    max_per_class=DEFAULT_MAX_PER_CLASS,
)


def cache_entry(image_size, cache=None, **selection):
    """(folder, stem, key) of the cache entry of ``load_glyphs`` with these arguments
    (see ``builder.load_or_build``); the key names every package the build reads."""
    selection = {**SELECTION, **selection}
    packages = {**PACKAGES, **(selection["packages"] or {})}
    fonts = sorted(FONT_PACKAGES if selection["families"] is None else selection["families"])
    key = {
        "build_version": BUILD_VERSION,
        "image_size": image_size,
        **{name: selection[name] for name in ("min_per_class", "max_classes", "max_per_class")},
        "packages": [packages[METADATA.name].spec]
        + [packages[f"@fontsource/{f}"].spec for f in fonts if f"@fontsource/{f}" in packages],
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir(cache) / "glyphs", f"glyphs-{image_size}px-v{BUILD_VERSION}-{digest}", key


def load_glyphs(image_size=64, cache=None, npm="npm", rebuild=False, workers=None, **selection):
    """The glyph ImageSet, built on first use (needs npm; downloads 855 MB of font
    packages and keeps 77 MB of them) and read from the cache afterwards (1.7 GiB in
    memory at 64 px). Drawn at 64 px; another ``image_size`` is the 64 px set resized
    (as an image folder of its PNGs would be read), and cached too. ``selection``: the
    keywords of ``SELECTION`` (``families``: only these font ids, a small set for tests;
    ``packages`` ({name: NpmPackage}) replaces pinned packages, for tests)."""
    unknown = set(selection) - set(SELECTION)
    if unknown:
        raise TypeError(f"load_glyphs() got unexpected keyword arguments {sorted(unknown)}")
    root, stem, key = cache_entry(image_size, cache, **selection)
    selection = {**SELECTION, **selection}

    def build():
        if image_size != glyph_render.IMAGE_SIZE:
            base = load_glyphs(glyph_render.IMAGE_SIZE, cache, npm, workers=workers, **selection)
            return resized(base, image_size), {"resized_from_px": glyph_render.IMAGE_SIZE}
        find_npm(npm)
        chosen, record = build_glyphs(
            root,
            selection["families"],
            {**PACKAGES, **(selection["packages"] or {})},
            npm,
            workers or os.cpu_count() or 1,
            selection["min_per_class"],
            selection["max_classes"],
            selection["max_per_class"],
        )
        return as_image_set(chosen), record

    return load_or_build(root, stem, key, build, rebuild)


def write_glyph_folder(out, cache=None, npm="npm", workers=None, **options):
    """Write the glyph set (64 px, built or read from the cache) as an image folder for
    ``pml-fieldlosses bench --data`` or other tools: ``out/<class>/<font key>.png``, and
    ``MANIFEST.json``, the build record (packages, fonts and their licences, classes).
    Written via ``out.part``, renamed at the end, so that a stopped run leaves no folder
    that looks complete; a failed write (a full disk) removes it and is a FileFault.
    ``options``: those of ``load_glyphs``. Returns ``out``."""
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; remove it first")
    data = load_glyphs(glyph_render.IMAGE_SIZE, cache, npm, workers=workers, **options)
    root, stem, _ = cache_entry(glyph_render.IMAGE_SIZE, cache, **options)
    part = out.with_name(out.name + ".part")
    try:
        shutil.rmtree(part, ignore_errors=True)
        for label, name in enumerate(tqdm.tqdm(data.class_names, desc="writing", unit="class", leave=False)):
            (part / name).mkdir(parents=True)
            for row in np.flatnonzero(data.labels == label):
                Image.fromarray(data.images[row]).save(part / name / f"{data.sources[row]}.png")
        shutil.copyfile(root / f"{stem}.json", part / "MANIFEST.json")
        part.rename(out)
    except OSError as e:
        shutil.rmtree(part, ignore_errors=True)  # e.g. a full disk: give its space back
        raise file_fault(e, e.filename or part, "writing the glyph folder") from e
    return out
