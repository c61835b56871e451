"""Multi-vendor emoji: the same emoji drawn by several vendors is one class.

Built once from npm packages (``npm pack``), verified, rendered on white,
freed of duplicate images (see ``builder.drop_duplicates``) and cached as arrays
under the user cache directory by the shared builder (``builder.py``). Classes are the base emoji of
``emoji-datasource`` (no skin-tone variants, no components) in Unicode order;
the first half are the training classes, the second half the test classes.
"""

import json
import re

import numpy as np

from .base import ImageSet, first_half_split, render_files
from .builder import drop_duplicates, fetch_packages, load_or_build
from .cache import cache_dir
from .npm import NpmPackage, find_npm
from .render import check_svg_renderer

# bump when the build's output for the same inputs changes
BUILD_VERSION = 2

PACKAGES = {
    p.name: p
    for p in [
        NpmPackage(
            "emoji-datasource",
            "16.0.0",
            "sha512-/qHKqK5Nr3+8zhgO6kHmF43Fm5C8HNn0AaFRIpgw8HF3+uF0Vfc8jgLI1ZQS5ba1vBzksS8NBCjHejwLb2D/Sg==",
        ),
        NpmPackage(
            "emoji-datasource-google",
            "16.0.0",
            "sha512-ZRexfzs7MVoLnmzZmNsO4TKhnAJp5D++Vm6PpUpH/jEQQlemp3l88CjZ+DoZ2faM9R4QxZkOPJCoT8DlPhfQ3A==",
        ),
        NpmPackage(
            "emoji-datasource-twitter",
            "16.0.0",
            "sha512-7F+uCuHH+7Qnrc15P5tnbvKkg9E6tlzi4MnT2uW1RlN4pLYTza6cP/dstIfSDMtpjFLWuZewWg8jBbuL2eyELQ==",
        ),
        NpmPackage(
            "openmoji",
            "17.0.0",
            "sha512-EBnYrNGdcdw+OSXmENeNE1yBNRu6tOraTmoOyUbJkTmvT/+XETp8RZLSJFzD3lrPc5N9CzsyPnRTk0Vp4UaI9w==",
        ),
        NpmPackage(
            "fluentui-emoji",
            "1.3.0",
            "sha512-JTXXwqIie2rWTgOkIJDJxr0WtwTz2WU4kdOq8buLVThYwQ264aFR2jdTyuon2oEbLqqGMT64zI4btyn1saB2xw==",
        ),
    ]
}
CATALOGUE_PACKAGE = "emoji-datasource"

# vendor -> npm package holding its images. Apple's and Facebook's sets are not
# licensed for this use and are not offered.
VENDORS = {
    "google": "emoji-datasource-google",
    "twitter": "emoji-datasource-twitter",
    "openmoji": "openmoji",
    "fluent-flat": "fluentui-emoji",
    "fluent-modern": "fluentui-emoji",
    "fluent-high-contrast": "fluentui-emoji",
}
DEFAULT_VENDORS = tuple(VENDORS)
LICENSES = {
    "google": "Noto Emoji, Apache-2.0",
    "twitter": "Twemoji, CC-BY-4.0",
    "openmoji": "OpenMoji, CC-BY-SA-4.0",
    "fluent-flat": "Fluent Emoji, MIT",
    "fluent-modern": "Fluent Emoji, MIT",
    "fluent-high-contrast": "Fluent Emoji, MIT",
}

# the files of each package that the build reads (paths inside the tarball)
_KEEP = {
    "emoji-datasource": ("package/emoji.json", "package/LICENSE"),
    "emoji-datasource-google": ("package/img/google/64/", "package/LICENSE"),
    "emoji-datasource-twitter": ("package/img/twitter/64/", "package/LICENSE"),
    "openmoji": ("package/color/svg/", "package/data/openmoji.json", "package/LICENSE.txt"),
    "fluentui-emoji": ("package/icons/", "package/LICENSE"),
}


def kebab(text):
    text = text.lower().replace("\u2019", "").replace("'", "")
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def emoji_classes(catalogue):
    """Base emoji of an emoji-datasource ``emoji.json`` list, in Unicode order
    (``sort_order``); skin-tone variants are nested in their base entry and
    components (skin tones, hair) are dropped."""
    entries = [e for e in catalogue if e.get("category") != "Component"]
    return sorted(entries, key=lambda e: e["sort_order"])


def _hex_candidates(entry):
    unified = entry["unified"]
    candidates = [unified, unified.replace("-FE0F", "")]
    if entry.get("non_qualified"):
        candidates.append(entry["non_qualified"])
    return list(dict.fromkeys(candidates))


def find_vendor_image(entry, vendor, package_dir, openmoji_names, fluent_files):
    """Path of ``entry``'s image by ``vendor``, or None if the vendor has none."""
    if vendor in ("google", "twitter"):
        path = package_dir / "package" / "img" / vendor / "64" / entry["image"]
        return path if entry.get(f"has_img_{vendor}") and path.is_file() else None
    if vendor == "openmoji":
        for code in _hex_candidates(entry):
            path = package_dir / "package" / "color" / "svg" / f"{code}.svg"
            if path.is_file():
                return path
        return None
    style = vendor[len("fluent-") :]
    names = [openmoji_names[c] for c in _hex_candidates(entry) if c in openmoji_names]
    names += [entry.get("name") or "", *entry.get("short_names", [])]
    for name in names:
        for filename in (f"{kebab(name)}.svg", f"{kebab(name)}-default.svg"):
            if filename in fluent_files[style]:
                return package_dir / "package" / "icons" / style / filename
    return None


def collect_emoji_files(root, vendors, packages, npm="npm"):
    """Find the image of every (class, vendor) in the verified packages; keep
    classes with at least two images. Returns (paths, class index per path,
    vendor per path, sha256 per path, class names)."""
    wanted = {name: (packages[name], _KEEP.get(name, ("package/",))) for name in _packages_for(vendors)}
    fetched = fetch_packages(wanted, root, npm)
    dirs = {name: folder for name, (folder, _) in fetched.items()}
    catalogue = json.loads((dirs[CATALOGUE_PACKAGE] / "package" / "emoji.json").read_text())
    openmoji_names, fluent_files = {}, {}
    if "openmoji" in dirs:
        table = json.loads((dirs["openmoji"] / "package" / "data" / "openmoji.json").read_text())
        openmoji_names = {e["hexcode"]: e["annotation"] for e in table}
    if "fluentui-emoji" in dirs:
        icons = dirs["fluentui-emoji"] / "package" / "icons"
        fluent_files = {d.name: {f.name for f in d.iterdir()} for d in icons.iterdir() if d.is_dir()}
    paths, labels, sources, hashes, names = [], [], [], [], []
    for entry in emoji_classes(catalogue):
        found = []
        for vendor in vendors:
            folder = dirs[VENDORS[vendor]]
            path = find_vendor_image(entry, vendor, folder, openmoji_names, fluent_files)
            if path is not None:
                found.append((vendor, path, fetched[VENDORS[vendor]][1][path.relative_to(folder).as_posix()]))
        if len(found) < 2:
            continue
        codes = _hex_candidates(entry)
        name = next((openmoji_names[c] for c in codes if c in openmoji_names), None)
        for vendor, path, sha256 in found:
            paths.append(path)
            labels.append(len(names))
            sources.append(vendor)
            hashes.append(sha256)
        names.append(name or (entry.get("name") or entry["unified"]).lower())
    return paths, labels, sources, hashes, names


def _packages_for(vendors):
    unknown = [v for v in vendors if v not in VENDORS]
    if unknown:
        raise ValueError(f"unknown emoji vendor(s) {unknown}; choose from {sorted(VENDORS)}")
    if len(set(vendors)) < 2:
        raise ValueError("emoji retrieval needs at least two vendors (one image per vendor and class)")
    return [CATALOGUE_PACKAGE] + sorted({VENDORS[v] for v in vendors})


def _build_key(image_size, vendors, packages):
    specs = [packages[n].spec for n in _packages_for(vendors)]
    return {
        "build_version": BUILD_VERSION,
        "image_size": image_size,
        "vendors": list(vendors),
        "packages": specs,
    }


def load_emoji(
    image_size=64, vendors=DEFAULT_VENDORS, cache=None, npm="npm", rebuild=False, workers=None, packages=None
):
    """The multi-vendor emoji ImageSet, built on first use (needs npm, and
    cairosvg for the SVG vendors) and read from the cache afterwards.
    ``packages`` ({name: NpmPackage}) replaces the pinned packages (tests)."""
    vendors = tuple(vendors)
    packages = {**PACKAGES, **(packages or {})}
    root = cache_dir(cache) / "emoji"
    stem = f"emoji-{image_size}px-{'-'.join(vendors)}-v{BUILD_VERSION}"

    def build():
        if any(VENDORS[v] in ("openmoji", "fluentui-emoji") for v in vendors):
            check_svg_renderer()
        find_npm(npm)
        paths, labels, sources, hashes, names = collect_emoji_files(root, vendors, packages, npm)
        images = render_files(paths, image_size, workers, desc=f"rendering emoji at {image_size}px")
        keep = drop_duplicates(images, np.array(labels))
        dropped = len(images) - len(keep)
        paths, hashes = [paths[i] for i in keep], [hashes[i] for i in keep]
        images, labels, sources = images[keep], np.array(labels)[keep], np.array(sources)[keep]
        used, labels = np.unique(labels, return_inverse=True)
        names = np.array(names)[used]
        data = ImageSet(images, labels, names, sources, first_half_split(len(names)), "emoji")
        return data, {
            "integrity": {n: packages[n].integrity for n in _packages_for(vendors)},
            "licenses": {v: LICENSES[v] for v in vendors},
            "dropped_duplicate_images": dropped,
            "source_files_sha256": {p.relative_to(root).as_posix(): h for p, h in zip(paths, hashes)},
        }

    return load_or_build(root, stem, _build_key(image_size, vendors, packages), build, rebuild)
