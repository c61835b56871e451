"""The glyph builder: the letter selection and clean-up, and a build from a fake npm
registry whose font packages hold real fonts (matplotlib's DejaVu, STIX and Last
Resort: no network); the real build is slow-marked."""

import errno
import io
import json
import os
import unicodedata
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from pml_fieldlosses.app.datasets import glyph_render, load_image_folder
from pml_fieldlosses.app.datasets.glyph_fonts import FONT_LICENSES, FONT_PACKAGES, LICENSE_NAMES
from pml_fieldlosses.app.datasets.glyphs import (
    LICENSES,
    METADATA,
    STYLES,
    cache_entry,
    choose_families,
    class_folder,
    load_glyphs,
    parse_unicode_range,
    select_images,
    write_glyph_folder,
)
from pml_fieldlosses.app.datasets.npm import NpmPackage, sha512_integrity
from pml_fieldlosses.app.errors import FileFault

from .test_datasets import install_fake_npm, make_tarball

matplotlib = pytest.importorskip("matplotlib")
FONT_DIR = Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf"

RANGES = {
    "latin": "U+0041-005A,U+0061-007A",
    "latin-ext": "U+0100-011F",
    "cyrillic": "U+0410-042F",
    "cyrillic-ext": "U+0460-046F",
    "greek": "U+0391-03A1,U+03A3-03A9",
}
FOUR = ["latin", "latin-ext", "cyrillic", "greek"]
# font id: (family, subsets, styles {style: font file}, licence in licenses.json or None)
FAMILIES = {
    "dejavu-sans": ("DejaVu Sans", FOUR, {"normal": "DejaVuSans", "italic": "DejaVuSans-Oblique"}, "OFL"),
    "dejavu-serif": (
        "DejaVu Serif",
        ["latin", "latin-ext", "cyrillic", "cyrillic-ext"],
        {"normal": "DejaVuSerif", "italic": "DejaVuSerif-Italic"},
        "OFL",
    ),
    "dejavu-sans-mono": (
        "DejaVu Sans Mono",
        FOUR,
        {"normal": "DejaVuSansMono", "italic": "DejaVuSansMono-Oblique"},
        "OFL",
    ),
    # not in licenses.json: the licence comes from the package's metadata.json
    "stix-general": ("STIX General", FOUR, {"normal": "STIXGeneral", "italic": "STIXGeneralItalic"}, None),
    # a placeholder font (one box per block): not a text font, left out after rendering
    "last-resort": ("Last Resort", FOUR, {"normal": "LastResortHE-Regular"}, "OFL"),
    # left out by the family choice: small caps, too few subsets; and one with no package
    "dejavu-sc": ("DejaVu SC", FOUR, {"normal": "DejaVuSans"}, "OFL"),
    "latin-only": ("Latin Only", ["latin", "latin-ext"], {"normal": "DejaVuSans"}, "OFL"),
    "not-on-npm": ("Not On Npm", FOUR, {"normal": "DejaVuSans"}, "OFL"),
}
ON_NPM = ["dejavu-sans", "dejavu-sans-mono", "dejavu-serif", "last-resort", "stix-general"]
OPTIONS = dict(min_per_class=5, max_classes=150, max_per_class=7)


def tarball(path, files):
    """An uncompressed npm-style tarball of {name inside: bytes} (fonts barely compress)."""
    return make_tarball(path, files, mode="w")


def metadata_files():
    fonts, licenses = {}, {}
    for font_id, (family, subsets, styles, licence) in FAMILIES.items():
        fonts[font_id] = {
            "family": family,
            "id": font_id,
            "subsets": subsets,
            "weights": [400] if font_id != "latin-only" else [400, 700],
            "styles": sorted(styles),
            "unicodeRange": {s: RANGES[s] for s in subsets},
            "category": "sans-serif",
        }
        if licence:
            licenses[font_id] = {"license": {"type": LICENSE_NAMES["OFL-1.1"]}}
    return {
        "package/data/google-fonts-v2.json": json.dumps(fonts).encode(),
        "package/data/licenses.json": json.dumps(licenses).encode(),
        "package/README.md": b"not kept",
    }


def font_package_files(font_id):
    _, subsets, styles, _ = FAMILIES[font_id]
    files = {"package/LICENSE": b"OFL-1.1", "package/metadata.json": b'{"license": "OFL-1.1"}'}
    for style, name in styles.items():
        data = (FONT_DIR / f"{name}.ttf").read_bytes()  # FreeType reads a font by its content
        for subset in subsets:
            files[f"package/files/{font_id}-{subset}-400-{style}.woff2"] = data
    files[f"package/files/{font_id}-latin-700-normal.woff2"] = b"not kept"
    return files


@pytest.fixture(scope="module")
def fake_registry(tmp_path_factory):
    folder = tmp_path_factory.mktemp("registry")
    contents = {METADATA.name: metadata_files()}
    contents.update({f"@fontsource/{f}": font_package_files(f) for f in FAMILIES if f != "not-on-npm"})
    packages = {}
    for name, files in contents.items():
        path = tarball(folder / f"{name}-0.0.1.tgz", files)
        packages[name] = NpmPackage(name, "0.0.1", sha512_integrity(path))
    return install_fake_npm(folder, packages), packages, folder


@pytest.fixture(scope="module")
def built(fake_registry, tmp_path_factory):
    npm, packages, _ = fake_registry
    cache = tmp_path_factory.mktemp("cache")
    data = load_glyphs(64, cache, npm, workers=1, packages=packages, families=FAMILIES, **OPTIONS)
    root, stem, _ = cache_entry(64, cache, packages=packages, families=FAMILIES, **OPTIONS)
    return data, json.loads((root / f"{stem}.json").read_text()), cache


def test_build_from_fake_registry(built):
    data, record, _ = built
    assert data.name == "glyphs" and data.images.shape[1:] == (64, 64, 3)
    letters = [chr(int(name.split("U+")[1], 16)) for name in data.class_names]
    assert list(data.class_names) == sorted(class_folder(c) for c in letters)  # ordered by the hash
    assert data.num_train_classes == data.num_classes // 2 and 4 <= data.num_classes <= 150
    fonts = {f"{f}-{s}" for f in ON_NPM if f != "last-resort" for s in STYLES}
    assert set(data.sources) == fonts
    assert record["fonts_left_out_as_not_text"] == ["last-resort-normal"]
    assert record["families_without_fontsource_package"] == ["not-on-npm"]
    assert set(record["fonts"]) == set(ON_NPM) - {"last-resort"}
    assert all(
        lic == LICENSE_NAMES["OFL-1.1"] for lic in record["licenses"].values()
    )  # stix from its package
    counts = np.bincount(data.labels)
    assert counts.min() >= 5 and counts.max() <= 7
    assert record["num_images"] == len(data.images) and record["num_classes"] == data.num_classes
    for label in range(data.num_classes):
        rows = np.flatnonzero(data.labels == label)
        keys = list(data.sources[rows])
        assert keys == sorted(keys) and len(set(keys)) == len(keys)  # one image per font, in font order
        flat = {data.images[r].tobytes() for r in rows}
        assert len(flat) == len(rows)  # no repeats within a class
    # look-alikes: no font gives one drawing to two letters; Cyrillic A is Latin A in DejaVu
    for font in fonts:
        rows = np.flatnonzero(data.sources == font)
        assert len({data.images[r].tobytes() for r in rows}) == len(rows)
    assert "\u0410" not in letters and "\u0391" not in letters
    assert {"A", "a", "\u0414", "\u0394"} <= set(letters)  # Cyrillic De and Greek Delta are classes
    assert all(unicodedata.category(c) in ("Lu", "Ll", "Lt", "Lo") for c in letters)
    # black ink on white, centred: every image has ink and white corners
    assert (data.images[:, 0, 0] == 255).all() and (data.images.min(axis=(1, 2, 3)) < 64).all()
    assert (data.images[..., 0] == data.images[..., 2]).all()


def test_cache_other_sizes_and_the_folder(built, fake_registry, tmp_path):
    data, record, cache = built
    _, packages, folder = fake_registry
    calls = (folder / "calls.log").read_text()
    again = load_glyphs(64, cache, "/nonexistent/npm", packages=packages, families=FAMILIES, **OPTIONS)
    assert again.fingerprint() == data.fingerprint()  # from the cache: npm is not needed
    small = load_glyphs(32, cache, "/nonexistent/npm", packages=packages, families=FAMILIES, **OPTIONS)
    assert (folder / "calls.log").read_text() == calls
    out = write_glyph_folder(tmp_path / "glyphs", cache, "/nonexistent/npm", packages=packages,
                             families=FAMILIES, **OPTIONS)  # fmt: skip
    assert json.loads((out / "MANIFEST.json").read_text()) == record
    # the folder reads back as the same set, at 64 px and resized
    for size, expected in ((64, data), (32, small)):
        read = load_image_folder(out, size, workers=1)
        np.testing.assert_array_equal(read.images, expected.images)
        np.testing.assert_array_equal(read.labels, expected.labels)
        assert list(read.class_names) == list(expected.class_names)
        assert read.fingerprint() == expected.fingerprint()
    with pytest.raises(FileExistsError):
        write_glyph_folder(out, cache, packages=packages, families=FAMILIES, **OPTIONS)


def test_too_few_letters_is_said(fake_registry, tmp_path):
    npm, packages, _ = fake_registry
    with pytest.raises(ValueError, match="only 0 letters have 2 images; lower min_per_class"):
        load_glyphs(
            64, tmp_path, npm, workers=1, packages=packages, families=["last-resort"], min_per_class=2
        )


def test_parse_unicode_range_and_family_choice():
    assert parse_unicode_range("U+0041-0043, U+0131,u+00e9") == {0x41, 0x42, 0x43, 0x131, 0xE9}
    fonts = json.loads(metadata_files()["package/data/google-fonts-v2.json"])
    assert choose_families(fonts) == sorted(set(ON_NPM) | {"not-on-npm"})


def test_select_images_drops_repeats_and_caps_classes():
    png = {c: c.encode() for c in "abcdefgh"}
    rendered = {
        "f1-normal": {"a": png["a"], "b": png["b"]},
        "f2-normal": {"a": png["a"], "b": png["c"]},  # a repeats f1's drawing: dropped
        "f3-normal": {"a": png["d"], "b": png["e"], "c": png["f"]},
    }
    chosen, repeats = select_images(rendered, min_per_class=2, max_classes=10, max_per_class=10)
    assert repeats == 1
    assert chosen == {
        "a": {"f1-normal": b"a", "f3-normal": b"d"},
        "b": {k: rendered[k]["b"] for k in rendered},
    }
    chosen, _ = select_images(rendered, min_per_class=2, max_classes=1, max_per_class=2)
    assert list(chosen) == ["b"] and len(chosen["b"]) == 2  # the largest class, capped


def test_is_text_font_and_look_alikes():
    distinct = {c: c.encode() for c in glyph_render.BASIC_LETTERS}
    assert glyph_render.is_text_font(distinct)
    assert not glyph_render.is_text_font({c: b"box" for c in glyph_render.BASIC_LETTERS})
    canvas = np.full((64, 64), 255, dtype=np.uint8)
    canvas[20:40, 20:30] = 0
    one = np.asarray(Image.fromarray(canvas))
    shifted = np.roll(one, 1, axis=1)

    def png(array):
        buffer = io.BytesIO()
        Image.fromarray(array).convert("RGB").save(buffer, format="PNG")
        return buffer.getvalue()

    # "a" and "\u0430" are the same image in 3 fonts, so a pixel's shift in a 4th is a look-alike too
    rendered = {f"f{i}": {"a": png(one), "\u0430": png(one)} for i in range(3)}
    rendered["f3"] = {"a": png(one), "\u0430": png(shifted), "b": png(255 - one)}
    kept, dropped = glyph_render.drop_look_alikes(rendered)
    assert dropped == 4 and all(set(images) <= {"a", "b"} for images in kept.values())
    assert set(kept["f3"]) == {"a", "b"}


def test_pins_and_licences_agree():
    assert METADATA.integrity.startswith("sha512-")
    assert len(FONT_PACKAGES) >= 150
    for font_id, package in FONT_PACKAGES.items():
        assert package.name == f"@fontsource/{font_id}"
        assert package.integrity.startswith("sha512-") and package.version.count(".") == 2
        assert FONT_LICENSES[font_id] in LICENSE_NAMES.values()
    assert set(LICENSES) == {f"{f}-{s}" for f in FONT_PACKAGES for s in STYLES}


@pytest.mark.slow
def test_real_build_from_npm(tmp_path):
    """Downloads the pinned font packages (855 MB) and renders every letter of every
    font: about 13 minutes on two cores (918 classes, 146 918 images with Pillow 13)."""
    data = load_glyphs(64, cache=tmp_path)
    assert 880 <= data.num_classes <= 960 and 140_000 <= len(data.images) <= 155_000
    assert data.num_train_classes == data.num_classes // 2
    counts = np.bincount(data.labels)
    assert counts.min() >= 60 and counts.max() <= 250
    assert {class_folder("A"), class_folder("a"), class_folder("\u0416")} <= set(data.class_names)
    assert set(data.sources) <= set(LICENSES)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(share=st.floats(0, 1, exclude_max=True))
def test_a_full_disk_while_writing_the_folder_is_named_and_a_rerun_writes_it(
    built, fake_registry, tmp_path_factory, share
):
    """The disk fills when a class folder (a ``share`` of the way) is made: a FileFault names
    the path, the unfinished ``.part`` folder is removed (its space given back), nothing
    looks complete; a rerun writes the whole folder."""
    data, record, cache = built
    _, packages, _ = fake_registry
    out = tmp_path_factory.mktemp("written") / "glyphs"
    made, real_mkdir, fail_at = [], os.mkdir, int(share * data.num_classes)

    def mkdir(path, *args, **kwargs):
        if str(path).startswith(str(out.parent)):
            made.append(path)
            if len(made) > fail_at:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_mkdir(path, *args, **kwargs)

    options = dict(packages=packages, families=FAMILIES, **OPTIONS)
    with mock.patch.object(os, "mkdir", mkdir), pytest.raises(FileFault) as caught:
        write_glyph_folder(out, cache, "/nonexistent/npm", **options)
    assert f"writing the glyph folder {out}.part" in str(caught.value) and "the disk is full" in str(
        caught.value
    )
    assert not out.exists() and not out.with_name("glyphs.part").exists()
    write_glyph_folder(out, cache, "/nonexistent/npm", **options)
    assert json.loads((out / "MANIFEST.json").read_text()) == record
    assert len(list(out.glob("*/*.png"))) == len(data.images)
