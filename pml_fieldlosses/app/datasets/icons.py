"""Multi-set icons: the same icon concept drawn by many open-source icon sets is one class.

Built once from npm packages by the shared builder (``builder.py``: ``npm pack``, verified),
rendered black on white and cached as arrays under the user cache directory.
Icons are matched across sets by name: each source (one style of one set)
names its files ``<name><style suffix>.svg``; the style suffix is removed
where that set uses it as a style marker (``remixicon``'s ``-line``/``-fill``,
``mdi``'s ``-outline`` ...), never elsewhere (``chart-line`` in another set is
a line chart), then names are normalised (``normalise``: lower case, ``_``
and spaces to ``-``) and a few synonyms that the sets themselves use for the
same concept are merged (``SYNONYMS``). A class is kept when at least
``min_sets`` different packages draw it; every class has one image per
source that draws it. Classes are ordered by a hash of their name (a stable,
alphabet-independent mix); the first half are the training classes, the
second half the test classes.
"""

import hashlib
import json
import re
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .base import ImageSet, first_half_split, render_files
from .builder import drop_duplicates, fetch_packages, load_or_build
from .cache import cache_dir
from .npm import NpmPackage, find_npm
from .render import check_svg_renderer

# bump when the build's output for the same inputs changes
BUILD_VERSION = 1
DEFAULT_MIN_SETS = 4

PACKAGES = {
    p.name: p
    for p in [
        NpmPackage(
            "lucide-static",
            "1.62.0",
            "sha512-WBZA/m2PvkFpMGHDtsBck5P2A9G4ehLlYu4GwwICcmEm1BvYVgj00lCDxKRWLlbMlOibLaiwdQ88G5pHkSWgwA==",
        ),
        NpmPackage(
            "@tabler/icons",
            "3.51.0",
            "sha512-0pinvPZz7YeX+OSfxuEAbnEPWbocVXW5iU8h5lh41pYG8sZuQfpWECC980lxOT0clGIcNGn8xsBr+zKaRGdA/g==",
        ),
        NpmPackage(
            "feather-icons",
            "4.29.2",
            "sha512-0TaCFTnBTVCz6U+baY2UJNKne5ifGh7sMG4ZC2LoBWCZdIyPa+y6UiR4lEYGws1JOFWdee8KAsAIvu0VcXqiqA==",
        ),
        NpmPackage(
            "heroicons",
            "2.2.0",
            "sha512-yOwvztmNiBWqR946t+JdgZmyzEmnRMC2nxvHFC90bF1SUttwB6yJKYeme1JeEcBfobdOs827nCyiWBS2z/brog==",
        ),
        NpmPackage(
            "@phosphor-icons/core",
            "2.1.1",
            "sha512-v4ARvrip4qBCImOE5rmPUylOEK4iiED9ZyKjcvzuezqMaiRASCHKcRIuvvxL/twvLpkfnEODCOJp5dM4eZilxQ==",
        ),
        NpmPackage(
            "bootstrap-icons",
            "1.13.2",
            "sha512-fAU1Ly3dH7hwRg+CB8EZ0Vl0fF80zgXHeUVJyfUOKzoURr+TbwISbCW5tKUoQLERaWYG2emTCybcPbD96hdD1A==",
        ),
        NpmPackage(
            "ionicons",
            "8.1.0",
            "sha512-XSM2gYWTXxSYTwjmKWAoy4yR7AbAFDjpc5ZIivAiGXskM0fe5CdMPfs6InQRUcrYtVb2WZ/0HQ1/jeh3JW78SA==",
        ),
        NpmPackage(
            "@mdi/svg",
            "7.4.47",
            "sha512-WQ2gDll12T9WD34fdRFgQVgO8bag3gavrAgJ0frN4phlwdJARpE6gO1YvLEMJR0KKgoc+/Ea/A0Pp11I00xBvw==",
        ),
        # 4.7.0 is the last release under Apache-2.0; from 4.8.0 the icons carry
        # the "Remix Icon License v1.0", which forbids redistributing them as a collection
        NpmPackage(
            "remixicon",
            "4.7.0",
            "sha512-g2pHOofQWARWpxdbrQu5+K3C8ZbqguQFzE54HIMWFCpFa63pumaAltIgZmFMRQpKKBScRWQASQfWxS9asNCcHQ==",
        ),
        NpmPackage(
            "simple-line-icons",
            "2.5.5",
            "sha512-v52iGG/qFZTSD/70yOfA1lYoN6zmjEfDjzFT6U6jNSCsh/aeVjy+8sYyTXWz1w7tLIkN2XeMmG+cLJp/0zYK4Q==",
        ),
        NpmPackage(
            "@primer/octicons",
            "19.42.0",
            "sha512-MEcHxVxNHu1I2Ndk5Mcwp7tfBiDk/EpytDJgKOfE2ldqIczWucVrZNeNU4wtEN5mnNudZ0YL5G0spax3bSMT4w==",
        ),
        NpmPackage(
            "iconoir",
            "7.12.1",
            "sha512-7ei4jd1bss0Ukyz/bbM9Zc96aLfZuwTEkSW8u5fx5h3X9912MsnmWwPw9LyTUtcf0ShfTzQeQ9oG7IslW3hrLg==",
        ),
        NpmPackage(
            "@fortawesome/fontawesome-free",
            "7.3.1",
            "sha512-wmglKKPDIkgV3aWlZzWECCPoGIkYCulzBwxG9+w7rc5BGapZ6cPMpoPOT8k36J0Ni7PPX6c/rsoMWfS4d1MUMg==",
        ),
        NpmPackage(
            "@material-design-icons/svg",
            "0.14.15",
            "sha512-6nbjwGwyJnphwQUscJAYqw1Tk6+W8KvsgOAeyVgzIFXVsHfgX5XyplTUcZ29wbcTUysMMyCUi1LYpmFKA/e61g==",
        ),
        NpmPackage(
            "@carbon/icons",
            "11.89.0",
            "sha512-M54u+J19d+nUSp2mpRqc1Opcsqx/bv5oLLk8ECVwE0PGWmUiUlJkfl6NbWHcA2pOIyvJoEwv686KsCO1Q7RSlQ==",
        ),
        NpmPackage(
            "eva-icons",
            "1.1.3",
            "sha512-QBSEWNbEx1H0numXP1qgxKVCZHonRaky5ft4pGzQBcO4cy7mEja6TuJ8rc7BqX2pmkvetVQWKDH+DK/8y7GTag==",
        ),
        NpmPackage(
            "boxicons",
            "2.1.4",
            "sha512-BvJNfYfnE4g9WQ7GL91fftxMOTwAleWlPFwvQJPYb/Ju7aLjlQ/Eu55AH9JLNk/OR82z+ZSq4TbKzbV/e5Rr0A==",
        ),
    ]
}

# the icons' licence per package, as the package's own licence file states it
LICENSES_BY_PACKAGE = {
    "lucide-static": "Lucide, ISC",
    "@tabler/icons": "Tabler Icons, MIT",
    "feather-icons": "Feather, MIT",
    "heroicons": "Heroicons, MIT",
    "@phosphor-icons/core": "Phosphor Icons, MIT",
    "bootstrap-icons": "Bootstrap Icons, MIT",
    "ionicons": "Ionicons, MIT",
    "@mdi/svg": "Material Design Icons (Pictogrammers Free License: icons Apache-2.0)",
    "remixicon": "Remix Icon 4.7.0, Apache-2.0",
    "simple-line-icons": "Simple Line Icons, MIT",
    "@primer/octicons": "Octicons, MIT",
    "iconoir": "Iconoir, MIT",
    "@fortawesome/fontawesome-free": "Font Awesome Free, icons CC-BY-4.0",
    "@material-design-icons/svg": "Google Material Icons, Apache-2.0",
    "@carbon/icons": "IBM Carbon icons, Apache-2.0",
    "eva-icons": "Eva Icons, MIT (package.json; the tarball has no licence file)",
    "boxicons": "Boxicons, MIT",
}


class IconSource(NamedTuple):
    """One style of one icon set: the SVG files under ``folder`` (a path inside
    the package's tarball) whose remaining path matches ``pattern`` in full;
    the pattern's group ``name`` is the icon's name in that set."""

    name: str
    package: str
    folder: str
    pattern: str

    def icon_name(self, path):
        """The icon name of ``path`` (inside the tarball), or None if the file is not of this source."""
        if not path.startswith(self.folder):
            return None
        match = re.fullmatch(self.pattern, path[len(self.folder) :])
        return match.group("name") if match else None


_PLAIN = r"(?P<name>[^/]+)\.svg"


def _without(*suffixes, end=""):
    """Files ``<name><end>.svg`` whose name does not end in one of ``suffixes`` (the set's other styles)."""
    lookbehinds = "".join(f"(?<!{re.escape(s)})" for s in suffixes)
    return rf"(?P<name>[^/]+?){lookbehinds}{re.escape(end)}\.svg"


def _with(suffix, prefix=""):
    return rf"{re.escape(prefix)}(?P<name>[^/]+){re.escape(suffix)}\.svg"


SOURCES = {
    s.name: s
    for s in [
        IconSource("lucide", "lucide-static", "package/icons/", _PLAIN),
        IconSource("tabler-outline", "@tabler/icons", "package/icons/outline/", _PLAIN),
        IconSource("tabler-filled", "@tabler/icons", "package/icons/filled/", _PLAIN),
        IconSource("feather", "feather-icons", "package/dist/icons/", _PLAIN),
        IconSource("heroicons-outline", "heroicons", "package/24/outline/", _PLAIN),
        IconSource("heroicons-solid", "heroicons", "package/24/solid/", _PLAIN),
        IconSource("phosphor-regular", "@phosphor-icons/core", "package/assets/regular/", _PLAIN),
        IconSource("phosphor-fill", "@phosphor-icons/core", "package/assets/fill/", _with("-fill")),
        IconSource("bootstrap", "bootstrap-icons", "package/icons/", _without("-fill")),
        IconSource("bootstrap-fill", "bootstrap-icons", "package/icons/", _with("-fill")),
        IconSource("ionicons", "ionicons", "package/dist/svg/", _without("-outline", "-sharp")),
        IconSource("ionicons-outline", "ionicons", "package/dist/svg/", _with("-outline")),
        IconSource("mdi", "@mdi/svg", "package/svg/", _without("-outline")),
        IconSource("mdi-outline", "@mdi/svg", "package/svg/", _with("-outline")),
        IconSource("remix-line", "remixicon", "package/icons/", r"[^/]+/" + _with("-line")),
        IconSource("remix-fill", "remixicon", "package/icons/", r"[^/]+/" + _with("-fill")),
        IconSource("simple-line", "simple-line-icons", "package/src/svgs/", _PLAIN),
        IconSource("octicons", "@primer/octicons", "package/build/svg/", _without("-fill", end="-24")),
        IconSource("octicons-fill", "@primer/octicons", "package/build/svg/", _with("-fill-24")),
        IconSource("iconoir-regular", "iconoir", "package/icons/regular/", _PLAIN),
        IconSource("iconoir-solid", "iconoir", "package/icons/solid/", _PLAIN),
        IconSource("fontawesome-solid", "@fortawesome/fontawesome-free", "package/svgs/solid/", _PLAIN),
        IconSource("fontawesome-regular", "@fortawesome/fontawesome-free", "package/svgs/regular/", _PLAIN),
        IconSource("material-filled", "@material-design-icons/svg", "package/filled/", _PLAIN),
        IconSource("material-outlined", "@material-design-icons/svg", "package/outlined/", _PLAIN),
        IconSource("carbon", "@carbon/icons", "package/svg/32/", _PLAIN),
        IconSource("eva-fill", "eva-icons", "package/fill/svg/", _PLAIN),
        IconSource("eva-outline", "eva-icons", "package/outline/svg/", _with("-outline")),
        IconSource("boxicons-regular", "boxicons", "package/svg/regular/", _with("", prefix="bx-")),
        IconSource("boxicons-solid", "boxicons", "package/svg/solid/", _with("", prefix="bxs-")),
    ]
}
DEFAULT_SOURCES = tuple(SOURCES)
LICENSES = {s.name: LICENSES_BY_PACKAGE[s.package] for s in SOURCES.values()}

# names that some sets give to a concept that other sets call by the main name:
# {alias: main name}. Checked on the pinned packages: no set but Font Awesome
# (x, xmark, magnifying-glass, add, remove) and Material (photo, call) has both
# names, and there the file of the main name is kept (the right one: Font
# Awesome's x is the letter, its remove the xmark). Not merged: home/house,
# pencil/edit, user/person, cog/settings, which several sets draw as different icons.
SYNONYMS = {
    "x": "close",
    "xmark": "close",
    "envelope": "mail",
    "magnifying-glass": "search",
    "gear": "settings",
    "notifications": "bell",
    "checkmark": "check",
    "add": "plus",
    "remove": "minus",
    "information": "info",
    "photo": "image",
    "call": "phone",
    "favorite": "heart",
}


def clean(name):
    """Lower case, ``_``, ``.`` and spaces as ``-``, runs of ``-`` as one (carbon's ``warning--alt``)."""
    return re.sub(r"[\s_.\-]+", "-", name.strip().lower()).strip("-")


def normalise(name):
    """The class name of an icon name: ``clean``, then ``SYNONYMS``."""
    key = clean(name)
    return SYNONYMS.get(key, key)


def match_icons(paths, sources):
    """Group files by icon concept. ``paths`` is an iterable of (package,
    path inside the package); ``sources`` a list of IconSource. Returns
    {class name: {source name: path}}: one file per source and class; where
    several files of a source fall in one class, the one whose own name is the
    class name is kept, else the first in sorted order."""
    by_package = {}
    for source in sources:
        by_package.setdefault(source.package, []).append(source)
    found = {}
    for package, path in sorted(paths):
        for source in by_package.get(package, ()):
            name = source.icon_name(path)
            if name is None:
                continue
            label = normalise(name)
            found.setdefault(label, {}).setdefault(source.name, []).append((clean(name) != label, path))
    return {label: {s: min(files)[1] for s, files in per.items()} for label, per in found.items()}


def class_order(names):
    """Classes sorted by the sha256 of their name: a fixed mix, so that the
    first-half split does not put whole families (``arrow-*``) on one side."""
    return sorted(names, key=lambda n: hashlib.sha256(n.encode()).hexdigest())


def select_classes(matches, sources, min_sets=DEFAULT_MIN_SETS):
    """The class names of ``matches`` drawn by at least ``min_sets`` different
    packages, in ``class_order``."""
    package_of = {s.name: s.package for s in sources}
    return class_order(
        label for label, per in matches.items() if len({package_of[s] for s in per}) >= min_sets
    )


def _packages_for(sources):
    unknown = [s for s in sources if s not in SOURCES]
    if unknown:
        raise ValueError(f"unknown icon source(s) {unknown}; choose from {sorted(SOURCES)}")
    return sorted({SOURCES[s].package for s in sources})


def collect_icon_files(root, sources, packages, npm="npm", min_sets=DEFAULT_MIN_SETS):
    """Find the file of every (class, source) in the verified packages, for the
    classes drawn by at least ``min_sets`` packages. Returns (paths, class index
    per path, source per path, sha256 per path, class names)."""
    fetched = fetch_packages(
        {name: (packages[name], ("package/",)) for name in _packages_for(sources)}, root, npm
    )
    chosen = [SOURCES[s] for s in sources]
    matches = match_icons(((name, rel) for name, (_, files) in fetched.items() for rel in files), chosen)
    names = select_classes(matches, chosen, min_sets)
    paths, labels, found_in, hashes = [], [], [], []
    for label, name in enumerate(names):
        for source in chosen:
            rel = matches[name].get(source.name)
            if rel is None:
                continue
            folder, files = fetched[source.package]
            paths.append(folder / rel)
            labels.append(label)
            found_in.append(source.name)
            hashes.append(files[rel])
    return paths, labels, found_in, hashes, names


def check_not_blank(images, paths):
    """Refuse images that rendered as plain white (an SVG the renderer drew nothing of)."""
    blank = [str(p) for image, p in zip(images, paths) if image.min() == 255]
    if blank:
        raise ValueError(f"{len(blank)} icon(s) rendered blank, e.g. {blank[:3]}")


def keep_drawn_by(labels, sources, min_sets):
    """Indices of the images whose class is still drawn by ``min_sets`` packages."""
    packages = np.array([SOURCES[s].package for s in sources])
    keep = [i for i, label in enumerate(labels) if len(set(packages[labels == label])) >= min_sets]
    return np.array(keep, dtype=np.int64)


def _build_key(image_size, sources, packages, min_sets):
    return {
        "build_version": BUILD_VERSION,
        "image_size": image_size,
        "sources": list(sources),
        "min_sets": min_sets,
        "synonyms": SYNONYMS,
        "packages": [packages[n].spec for n in _packages_for(sources)],
    }


def load_icons(
    image_size=64,
    sources=DEFAULT_SOURCES,
    min_sets=DEFAULT_MIN_SETS,
    cache=None,
    npm="npm",
    rebuild=False,
    workers=None,
    packages=None,
):
    """The multi-set icon ImageSet, built on first use (needs npm and cairosvg)
    and read from the cache afterwards. ``packages`` ({name: NpmPackage})
    replaces pinned packages (tests)."""
    sources = tuple(sources)
    if min_sets < 2:
        raise ValueError(f"min_sets must be >= 2 (retrieval needs two images per class), got {min_sets}")
    packages = {**PACKAGES, **(packages or {})}
    root = cache_dir(cache) / "icons"
    key = _build_key(image_size, sources, packages, min_sets)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    stem = f"icons-{image_size}px-min{min_sets}-v{BUILD_VERSION}-{digest}"

    def build():
        check_svg_renderer()
        find_npm(npm)
        paths, labels, found_in, hashes, names = collect_icon_files(root, sources, packages, npm, min_sets)
        images = render_files(paths, image_size, workers, desc=f"rendering icons at {image_size}px")
        check_not_blank(images, paths)
        labels = np.array(labels)
        keep = drop_duplicates(images, labels)
        keep = keep[keep_drawn_by(labels[keep], np.array(found_in)[keep], min_sets)]
        dropped = len(images) - len(keep)
        paths, hashes = [paths[i] for i in keep], [hashes[i] for i in keep]
        images, labels, found_in = images[keep], labels[keep], np.array(found_in)[keep]
        used, labels = np.unique(labels, return_inverse=True)
        names = np.array(names)[used]
        data = ImageSet(images, labels, names, found_in, first_half_split(len(names)), "icons")
        return data, {
            "integrity": {n: packages[n].integrity for n in _packages_for(sources)},
            "licenses": {n: LICENSES_BY_PACKAGE[n] for n in _packages_for(sources)},
            "dropped_duplicate_images": dropped,
            "source_files_sha256": {Path(p).relative_to(root).as_posix(): h for p, h in zip(paths, hashes)},
        }

    return load_or_build(root, stem, key, build, rebuild)
