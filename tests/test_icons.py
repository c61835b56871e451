"""The multi-set icon builder: name matching, class selection, and a build from a
tiny fake npm registry of synthetic SVGs (no network); the real build is slow-marked."""

import json

import numpy as np
import pytest

from pml_fieldlosses.app.datasets import icons
from pml_fieldlosses.app.datasets.icons import LICENSES, LICENSES_BY_PACKAGE, PACKAGES, SOURCES, SYNONYMS, IconSource, check_not_blank, class_order, load_icons, match_icons, normalise, select_classes
from pml_fieldlosses.app.datasets.npm import NpmPackage, sha512_integrity

from .test_datasets import install_fake_npm, make_tarball


@pytest.mark.parametrize(
    "source, path, name",
    [
        ("bootstrap", "package/icons/heart.svg", "heart"),
        ("bootstrap", "package/icons/heart-fill.svg", None),
        ("bootstrap-fill", "package/icons/heart-fill.svg", "heart"),
        ("bootstrap-fill", "package/icons/heart.svg", None),
        ("remix-line", "package/icons/Health & Medical/heart-line.svg", "heart"),
        ("remix-line", "package/icons/System/heart-fill.svg", None),
        ("remix-fill", "package/icons/System/heart-fill.svg", "heart"),
        ("octicons", "package/build/svg/heart-24.svg", "heart"),
        ("octicons", "package/build/svg/heart-16.svg", None),
        ("octicons", "package/build/svg/heart-fill-24.svg", None),
        ("octicons-fill", "package/build/svg/heart-fill-24.svg", "heart"),
        ("ionicons", "package/dist/svg/heart.svg", "heart"),
        ("ionicons", "package/dist/svg/heart-sharp.svg", None),
        ("ionicons-outline", "package/dist/svg/heart-outline.svg", "heart"),
        ("mdi", "package/svg/heart-outline.svg", None),
        ("mdi-outline", "package/svg/heart-outline.svg", "heart"),
        ("phosphor-fill", "package/assets/fill/heart-fill.svg", "heart"),
        ("eva-outline", "package/outline/svg/heart-outline.svg", "heart"),
        ("boxicons-regular", "package/svg/regular/bx-heart.svg", "heart"),
        ("boxicons-solid", "package/svg/solid/bxs-heart.svg", "heart"),
        ("boxicons-solid", "package/svg/regular/bx-heart.svg", None),
        ("carbon", "package/svg/32/watson-health/heart.svg", None),  # sub-folders are not this source
        ("carbon", "package/svg/32/warning--alt.svg", "warning--alt"),
        ("lucide", "package/icons/heart.png", None),
        ("lucide", "package/README.md", None),
    ],
)
def test_each_source_reads_its_own_files_and_strips_only_its_style_marker(source, path, name):
    assert SOURCES[source].icon_name(path) == name


def test_normalise():
    assert normalise("Arrow_Back") == "arrow-back"
    assert normalise("warning--alt") == "warning-alt"
    assert normalise(" chart.line ") == "chart-line"
    for alias, main in SYNONYMS.items():
        assert normalise(alias) == main
        assert main not in SYNONYMS  # one step: no chains
    # style words inside names are kept: only each set's own suffix is removed, by its source
    assert normalise("chart-line") == "chart-line"
    assert normalise("heart-outline") == "heart-outline"


def test_match_keeps_one_file_per_source_and_prefers_the_main_name():
    sources = [
        IconSource("a", "pkg-a", "p/", icons._without("-fill")),
        IconSource("a-fill", "pkg-a", "p/", icons._with("-fill")),
        IconSource("b", "pkg-b", "q/", icons._PLAIN),
    ]
    paths = [
        ("pkg-a", "p/x.svg"),  # alias of "close"
        ("pkg-a", "p/close.svg"),  # the main name: kept for source "a"
        ("pkg-a", "p/close-fill.svg"),
        ("pkg-b", "q/xmark.svg"),  # only the alias: kept
        ("pkg-b", "q/Chart_Line.svg"),
        ("pkg-c", "p/close.svg"),  # a package no source reads
    ]
    matches = match_icons(paths, sources)
    assert matches == {
        "close": {"a": "p/close.svg", "a-fill": "p/close-fill.svg", "b": "q/xmark.svg"},
        "chart-line": {"b": "q/Chart_Line.svg"},
    }


def test_select_counts_packages_not_styles_and_orders_by_hash():
    sources = [
        IconSource("a", "pkg-a", "a/", icons._PLAIN),
        IconSource("a-fill", "pkg-a", "a/", icons._with("-fill")),
        IconSource("b", "pkg-b", "b/", icons._PLAIN),
        IconSource("c", "pkg-c", "c/", icons._PLAIN),
    ]
    matches = {
        "three-sets": {"a": "a/x.svg", "b": "b/x.svg", "c": "c/x.svg"},
        "two-sets-three-images": {"a": "a/y.svg", "a-fill": "a/y-fill.svg", "b": "b/y.svg"},
        "also-three": {"a-fill": "a/z-fill.svg", "b": "b/z.svg", "c": "c/z.svg"},
    }
    assert select_classes(matches, sources, min_sets=3) == class_order(["three-sets", "also-three"])
    assert select_classes(matches, sources, min_sets=2) == class_order(list(matches))
    assert select_classes(matches, sources, min_sets=4) == []
    names = [f"c{i}" for i in range(50)]
    assert class_order(names) == class_order(names[::-1]) != sorted(names)


def test_pins_licences_and_sources_agree():
    assert set(LICENSES_BY_PACKAGE) == set(PACKAGES)
    assert {s.package for s in SOURCES.values()} == set(PACKAGES)
    assert set(LICENSES) == set(SOURCES)
    for package in PACKAGES.values():
        assert package.integrity.startswith("sha512-") and package.version.count(".") == 2


def test_blank_renders_are_refused():
    images = np.full((2, 8, 8, 3), 255, dtype=np.uint8)
    images[0, 3, 3] = 0
    check_not_blank(images[:1], ["ok.svg"])
    with pytest.raises(ValueError, match="1 icon.*blank.*empty.svg"):
        check_not_blank(images, ["ok.svg", "empty.svg"])


def svg(index):
    """A distinct stroke-only drawing per index, in currentColor (as the stroke sets draw)."""
    a, b, c = 2 + index % 9, 3 + (index * 5) % 17, 4 + (index * 7) % 15
    return (
        '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="none" '
        'stroke="currentColor" stroke-width="2">'
        f'<path d="M{a} {b} L22 {c} M{c} 2 L{b} 22"/><circle cx="{b}" cy="{a + 8}" r="{1 + index % 4}"/></svg>'
    ).encode()


# (file in the package, class it draws, drawing): equal drawings are identical files
FAKE_FILES = {
    "lucide-static": [
        ("package/icons/heart.svg", 1), ("package/icons/star.svg", 2), ("package/icons/x.svg", 3),
        ("package/icons/home.svg", 4), ("package/icons/sun.svg", 5), ("package/icons/moon.svg", 6),
        ("package/icons/bell.svg", 7),
    ],
    "feather-icons": [
        ("package/dist/icons/heart.svg", 11), ("package/dist/icons/star.svg", 12),
        ("package/dist/icons/x.svg", 13), ("package/dist/icons/home.svg", 4),  # = lucide's home
        ("package/dist/icons/sun.svg", 15), ("package/dist/icons/moon.svg", 16),
    ],
    "bootstrap-icons": [
        ("package/icons/heart.svg", 21), ("package/icons/heart-fill.svg", 22), ("package/icons/home.svg", 23),
        ("package/icons/sun.svg", 24), ("package/icons/moon.svg", 2),  # = lucide's star: ambiguous
        ("package/icons/bell.svg", 26), ("package/icons/bell-fill.svg", 27),
    ],
    "eva-icons": [
        ("package/fill/svg/heart.svg", 31), ("package/outline/svg/heart-outline.svg", 32),
        ("package/fill/svg/close.svg", 33), ("package/fill/svg/home.svg", 34),
        ("package/outline/svg/sun-outline.svg", 35), ("package/outline/svg/sun.svg", 36),  # not a source
    ],
    "boxicons": [
        ("package/svg/regular/bx-heart.svg", 41), ("package/svg/regular/bx-star.svg", 42),
        ("package/svg/regular/bx-x.svg", 43), ("package/svg/regular/bx-home.svg", 44),
        ("package/svg/regular/bx-sun.svg", 45), ("package/svg/logos/bxl-github.svg", 46),
    ],
    "remixicon": [("package/icons/System/star-line.svg", 51), ("package/icons/System/bell-line.svg", 52)],
    "simple-line-icons": [
        ("package/src/svgs/star.svg", 61), ("package/src/svgs/close.svg", 62), ("package/src/svgs/moon.svg", 63),
    ],
}
FAKE_SOURCES = (
    "lucide", "feather", "bootstrap", "bootstrap-fill", "eva-fill", "eva-outline",
    "boxicons-regular", "remix-line", "simple-line",
)  # fmt: skip
# after matching, dropping duplicates and the classes left with < 4 sets
EXPECTED = {
    "heart": {"lucide", "feather", "bootstrap", "bootstrap-fill", "eva-fill", "eva-outline", "boxicons-regular"},
    "star": {"feather", "remix-line", "simple-line", "boxicons-regular"},  # lucide's star is also a moon
    "close": {"lucide", "feather", "eva-fill", "boxicons-regular", "simple-line"},
    "home": {"lucide", "bootstrap", "eva-fill", "boxicons-regular"},  # feather's copy dropped
    "sun": {"lucide", "feather", "bootstrap", "eva-outline", "boxicons-regular"},
}  # moon: 3 sets once the ambiguous drawing goes; bell: 3 sets (4 images)


@pytest.fixture
def fake_registry(tmp_path):
    folder = tmp_path / "registry"
    folder.mkdir()
    packages = {}
    for name, files in FAKE_FILES.items():
        content = {path: svg(drawing) for path, drawing in files}
        content["package/LICENSE"] = b"MIT"
        tarball = make_tarball(folder / f"{name}-0.0.1.tgz", content)
        packages[name] = NpmPackage(name, "0.0.1", sha512_integrity(tarball))
    return install_fake_npm(folder, packages), packages


def test_build_from_fake_registry(fake_registry, tmp_path):
    npm, packages = fake_registry
    cache = tmp_path / "cache"
    data = load_icons(32, FAKE_SOURCES, cache=cache, npm=npm, packages=packages, workers=1)
    assert data.name == "icons" and data.image_size == 32
    assert list(data.class_names) == class_order(EXPECTED)
    for label, name in enumerate(data.class_names):
        drawn_by = data.sources[data.labels == label]
        assert sorted(drawn_by) == sorted(EXPECTED[name])
    assert data.num_train_classes == 2
    assert (data.images.reshape(len(data.images), -1).min(1) == 0).all()  # currentColor strokes render black
    assert (data.images[..., 0] == data.images[..., 2]).all()  # and nothing else: grey levels only
    records = list((cache / "icons").glob("icons-32px-min4-v*.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["num_images"] == len(data.images) == sum(map(len, EXPECTED.values()))
    # the star/moon pair, feather's copy of home, then moon's other three images
    assert record["dropped_duplicate_images"] == 6
    assert set(record["licenses"]) == set(FAKE_FILES)
    again = load_icons(32, FAKE_SOURCES, cache=cache, npm="/nonexistent/npm", packages=packages)
    assert again.fingerprint() == data.fingerprint()  # from the cache: npm is not needed


def test_errors_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="unknown icon source.*'nope'"):
        load_icons(32, ("lucide", "nope"), cache=tmp_path, npm="/nonexistent/npm")
    with pytest.raises(ValueError, match="min_sets must be >= 2"):
        load_icons(32, min_sets=1, cache=tmp_path)


@pytest.mark.slow
def test_real_build_from_npm(tmp_path):
    """Downloads the pinned packages (about 40 MB) and renders every icon: minutes."""
    data = load_icons(64, cache=tmp_path)
    assert 850 <= data.num_classes <= 950 and 8000 <= len(data.images) <= 9000
    assert data.num_train_classes == data.num_classes // 2
    train = set(data.labels[data.is_train()])
    test = set(data.labels[~data.is_train()])
    assert train.isdisjoint(test) and len(train | test) == data.num_classes
    packages = np.array([SOURCES[s].package for s in data.sources])
    for label in range(data.num_classes):
        in_class = data.labels == label
        assert len(set(packages[in_class])) >= 4
        assert len(set(data.sources[in_class])) == in_class.sum()  # one image per source
    ink = (data.images.reshape(len(data.images), -1) < 128).mean(1)
    assert (ink > 0.005).all()  # every image has dark ink (the lightest, phosphor's "dot": 0.8 %)
    assert {"close", "heart", "home", "search", "settings", "star"} <= set(data.class_names)
