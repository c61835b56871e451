"""The emoji builder on a tiny fake npm registry, the shared builder's faults (a bad build
record, a half-written entry, concurrent builders, a checksum mismatch), safe unpacking,
and the image-folder loader. No network: a fake `npm` executable serves tarballs made here."""

import errno
import hashlib
import io
import json
import os
import stat
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from pml_fieldlosses.app.datasets import (
    ImageSet,
    cache_dir,
    IntegrityError,
    NpmPackage,
    UnsafeArchiveError,
    load_emoji,
    load_image_folder,
    safe_extract,
    sha512_integrity,
)
from pml_fieldlosses.app.datasets import emoji as emoji_module
from pml_fieldlosses.app.datasets.builder import fetch_package, load_or_build
from pml_fieldlosses.app.datasets.npm import npm_pack, sha256_file
from pml_fieldlosses.app.errors import FileFault

FAKE_NPM = """#!{python}
import json, shutil, sys
from pathlib import Path
here = Path(__file__).parent
registry = json.loads((here / "registry.json").read_text())
with open(here / "calls.log", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
spec = args[-1] if args[0] == "pack" else args[2]
if spec not in registry:
    sys.stderr.write("npm error 404 Not Found - " + spec + "\\n")
    sys.exit(1)
entry = registry[spec]
if args[0] == "pack":
    dest = Path(args[args.index("--pack-destination") + 1])
    shutil.copy(entry["tarball"], dest / entry["filename"])
    print(json.dumps([{{"filename": entry["filename"], "integrity": entry["reported"]}}]))
elif args[0] == "view":
    print(json.dumps(entry["registry"]))
"""

# name, unified, sort_order, category, google, twitter, openmoji annotation, fluent file
CLASSES = [
    ("GRINNING FACE", "1F600", 9, "Smileys & Emotion", True, True, "grinning face", "grinning-face"),
    ("RED APPLE", "1F34E", 8, "Food & Drink", True, True, "red apple", "red-apple-default"),
    ("DOG FACE", "1F436", 7, "Animals & Nature", True, False, "dog face", "dog-face"),
    ("ROCKET", "1F680", 6, "Travel & Places", True, True, "rocket", None),
    ("SOCCER BALL", "26BD", 5, "Activities", False, True, "soccer ball", "soccer-ball"),
    ("KEY", "1F511", 4, "Objects", True, True, "key", "key"),
    ("HEAVY HEART", "2764-FE0F", 3, "Symbols", True, True, "red heart", "red-heart"),
    ("CHEQUERED FLAG", "1F3C1", 2, "Flags", True, True, "chequered flag", "chequered-flag"),
    ("GLOBE", "1F30D", 1, "Travel & Places", True, True, "globe", None),
    ("STAR", "2B50", 0, "Symbols", True, True, "star", "star"),
]
# a component (skin tone) and an emoji with a single image: both must be left out
EXTRA = [
    ("EMOJI MODIFIER FITZPATRICK TYPE-1-2", "1F3FB", 10, "Component", True, True, None, None),
    ("LONELY", "1F9FF", 11, "Objects", True, False, None, None),
]


def png_bytes(colour, size=12):
    image = Image.new("RGBA", (size, size), (0, 0, 0, 0))  # transparent: must render white
    for x in range(3, size - 3):
        for y in range(3, size - 3):
            image.putpixel((x, y), colour + (255,))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def svg_bytes(colour):
    r, g, b = colour
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 72 72">'
        f'<rect x="18" y="18" width="36" height="36" fill="rgb({r},{g},{b})"/></svg>'
    ).encode()


def make_tarball(path, files, mode="w:gz"):
    """files: {name inside the tarball: bytes}; ``mode="w"``: uncompressed (fonts barely compress)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def colour_of(index, vendor):
    return ((37 * index + 11 * vendor) % 200 + 40, (53 * index) % 200 + 20, (91 * vendor) % 200 + 30)


def fake_packages(folder):
    """Tarballs of the five packages the builder reads, with CLASSES + EXTRA."""
    catalogue, om_table = [], []
    google, twitter, openmoji, fluent = {}, {}, {}, {}
    for i, (name, code, order, category, has_g, has_t, annotation, fluent_file) in enumerate(CLASSES + EXTRA):
        image = code.lower() + ".png"
        catalogue.append(
            dict(
                name=name,
                unified=code,
                non_qualified=None,
                image=image,
                sort_order=order,
                category=category,
                has_img_google=has_g,
                has_img_twitter=has_t,
                short_names=[name.lower().replace(" ", "_")],
            )
        )
        if has_g:
            google[f"package/img/google/64/{image}"] = png_bytes(colour_of(i, 0))
        if has_t:
            twitter[f"package/img/twitter/64/{image}"] = png_bytes(colour_of(i, 1))
        if annotation:
            om_table.append({"hexcode": code, "annotation": annotation})
            openmoji[f"package/color/svg/{code}.svg"] = svg_bytes(colour_of(i, 2))
        if fluent_file:
            for k, style in enumerate(("flat", "modern", "high-contrast")):
                # two styles drawn alike: the copy within the class is dropped
                fluent[f"package/icons/{style}/{fluent_file}.svg"] = svg_bytes(colour_of(i, 3 + min(k, 1)))
    # a skin-tone variant file next to its base, which must not become a class
    twitter["package/img/twitter/64/1f600-1f3fb.png"] = png_bytes((1, 2, 3))
    # STAR's and GLOBE's twitter images are identical: ambiguous, both dropped
    twitter["package/img/twitter/64/2b50.png"] = twitter["package/img/twitter/64/1f30d.png"]
    openmoji["package/data/openmoji.json"] = json.dumps(om_table).encode()
    files = {
        "emoji-datasource": {"package/emoji.json": json.dumps(catalogue).encode(), "package/LICENSE": b"MIT"},
        "emoji-datasource-google": {**google, "package/README.md": b"not kept"},
        "emoji-datasource-twitter": twitter,
        "openmoji": openmoji,
        "fluentui-emoji": fluent,
    }
    packages = {}
    for name, content in files.items():
        tarball = make_tarball(folder / f"{name}-0.0.1.tgz", content)
        packages[name] = NpmPackage(name, "0.0.1", sha512_integrity(tarball))
    return packages


def install_fake_npm(folder, packages, tamper=None):
    registry = {}
    for p in packages.values():
        integrity = p.integrity
        registry[p.spec] = {
            "tarball": str(folder / f"{p.name}-0.0.1.tgz"),
            # npm's name for a scoped package's tarball: @scope/name -> scope-name-<version>.tgz
            "filename": f"{p.name.lstrip('@').replace('/', '-')}-0.0.1.tgz",
            "reported": integrity,
            "registry": "sha512-AAAA" if tamper == p.name else integrity,
        }
    (folder / "registry.json").write_text(json.dumps(registry))
    npm = folder / "npm"
    npm.write_text(FAKE_NPM.format(python=sys.executable))
    npm.chmod(npm.stat().st_mode | stat.S_IEXEC)
    return str(npm)


@pytest.fixture
def registry(tmp_path):
    folder = tmp_path / "registry"
    folder.mkdir()
    packages = fake_packages(folder)
    return folder, packages


def test_builder_renders_splits_and_caches(registry, tmp_path):
    folder, packages = registry
    npm = install_fake_npm(folder, packages)
    cache = tmp_path / "cache"
    data = load_emoji(16, cache=cache, npm=npm, packages=packages, workers=1)

    # classes: base emoji with >= 2 images, in sort_order (CLASSES are listed in reverse)
    expected = [c for c in reversed(CLASSES)]
    assert data.num_classes == len(expected) == 10
    assert list(data.class_names) == [c[6] for c in expected]  # openmoji annotations name the classes
    assert data.num_train_classes == 5
    assert data.images.shape[1:] == (16, 16, 3) and data.images.dtype == np.uint8
    # images per class: google + twitter + openmoji + 2 fluent styles (modern = high-contrast here)
    for label, (_, code, _, _, g, t, annotation, fluent) in enumerate(expected):
        sources = sorted(data.sources[data.labels == label])
        t = t and code not in ("2B50", "1F30D")  # the cross-class duplicate
        want = (["google"] if g else []) + (["twitter"] if t else []) + (["openmoji"] if annotation else [])
        want += ["fluent-flat", "fluent-modern"] if fluent else []
        assert sources == sorted(want)
    # transparent corners rendered white, the coloured centre kept (PNG and SVG)
    assert (data.images[:, 0, 0] == 255).all()
    index = {c[1]: i for i, c in enumerate(CLASSES)}
    for label, c in enumerate(expected):
        for vendor_id, vendor in enumerate(["google", "twitter", "openmoji"]):
            rows = np.flatnonzero((data.labels == label) & (data.sources == vendor))
            if len(rows):
                centre = data.images[rows[0], 8, 8].astype(int)
                assert np.abs(centre - colour_of(index[c[1]], vendor_id)).max() <= 3

    # the record: package integrity and the sha256 of every source file used
    record = json.loads(next((cache / "emoji").glob("*.json")).read_text())
    assert len(record["source_files_sha256"]) == len(data.images)
    assert record["dropped_duplicate_images"] == 2 + 8  # twitter STAR and GLOBE + 8 fluent copies
    assert record["integrity"] == {name: p.integrity for name, p in packages.items()}
    assert not (
        cache / "emoji" / "packages" / "emoji-datasource-google-0.0.1" / "package" / "README.md"
    ).exists()

    # second call: read from the cache, npm is not run again
    calls = (folder / "calls.log").read_text().count("\n")
    again = load_emoji(16, cache=cache, npm="no-such-npm-anywhere", packages=packages)
    assert (folder / "calls.log").read_text().count("\n") == calls
    np.testing.assert_array_equal(again.images, data.images)
    np.testing.assert_array_equal(again.labels, data.labels)


def test_tampered_files_are_detected(registry, tmp_path):
    folder, packages = registry
    npm = install_fake_npm(folder, packages)
    cache = tmp_path / "cache"
    load_emoji(16, cache=cache, npm=npm, packages=packages, workers=1)
    arrays = next((cache / "emoji").glob("*.npz"))
    with open(arrays, "ab") as f:
        f.write(b"x")
    with pytest.raises(IntegrityError, match="recorded sha256"):
        load_emoji(16, cache=cache, npm=npm, packages=packages)
    png = next((cache / "emoji" / "packages").glob("emoji-datasource-google-*/package/img/google/64/*.png"))
    png.write_bytes(b"not the original")
    with pytest.raises(IntegrityError, match="was modified"):
        load_emoji(16, cache=cache, npm=npm, packages=packages, rebuild=True)


def test_registry_integrity_mismatch_is_refused(registry, tmp_path):
    folder, packages = registry
    npm = install_fake_npm(folder, packages, tamper="openmoji")
    with pytest.raises(IntegrityError, match="registry metadata"):
        npm_pack(packages["openmoji"], tmp_path / "downloads", npm=npm)
    assert not list((tmp_path / "downloads").glob("*.tgz"))
    pinned = NpmPackage("openmoji", "0.0.1", "sha512-" + "B" * 86 + "==")
    npm = install_fake_npm(folder, packages)
    with pytest.raises(IntegrityError, match="pinned"):
        npm_pack(pinned, tmp_path / "downloads", npm=npm)


def test_missing_npm_and_unknown_vendor_have_clear_errors(tmp_path):
    with pytest.raises(RuntimeError, match="npm"):
        load_emoji(16, cache=tmp_path, npm="no-such-npm-anywhere")
    with pytest.raises(ValueError, match="unknown emoji vendor"):
        load_emoji(16, vendors=("google", "apple"), cache=tmp_path)
    assert "apple" not in emoji_module.VENDORS and "facebook" not in emoji_module.VENDORS


@pytest.mark.parametrize(
    "kind",
    ["parent", "absolute", "nested_parent", "symlink", "hardlink", "device"],
)
def test_unsafe_tar_entries_are_refused(tmp_path, kind):
    tarball = tmp_path / "evil.tgz"
    with tarfile.open(tarball, "w:gz") as tar:
        good = tarfile.TarInfo("package/ok.txt")
        good.size = 2
        tar.addfile(good, io.BytesIO(b"ok"))
        info = tarfile.TarInfo(
            {
                "parent": "../escaped.txt",
                "absolute": str(tmp_path / "abs.txt"),
                "nested_parent": "package/../../escaped.txt",
                "symlink": "package/link",
                "hardlink": "package/hard",
                "device": "package/dev",
            }[kind]
        )
        if kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        elif kind == "hardlink":
            info.type, info.linkname = tarfile.LNKTYPE, "package/ok.txt"
        elif kind == "device":
            info.type = tarfile.CHRTYPE
        data = b"evil"
        info.size = len(data) if info.type == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if info.size else None)
    dest = tmp_path / "dest"
    with pytest.raises(UnsafeArchiveError):
        safe_extract(tarball, dest)
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "abs.txt").exists()
    assert not (dest / "package" / "ok.txt").exists()  # nothing is unpacked from a refused archive


def test_safe_extract_refuses_a_symlinked_destination_folder(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(outside, dest / "package")
    tarball = make_tarball(tmp_path / "t.tgz", {"package/x.txt": b"x"})
    with pytest.raises(UnsafeArchiveError, match="outside"):
        safe_extract(tarball, dest)
    assert not (outside / "x.txt").exists()


def test_safe_extract_writes_selected_files_with_hashes(tmp_path):
    tarball = make_tarball(
        tmp_path / "t.tgz", {"package/a.txt": b"a", "package/b/c.txt": b"c", "package/d": b"d"}
    )
    hashes = safe_extract(tarball, tmp_path / "out", select=lambda n: n.endswith(".txt"))
    assert sorted(hashes) == ["package/a.txt", "package/b/c.txt"]
    assert (tmp_path / "out" / "package" / "b" / "c.txt").read_bytes() == b"c"
    assert not (tmp_path / "out" / "package" / "d").exists()


def write_folder(root, counts):
    for c, count in enumerate(counts):
        folder = root / f"class_{c:02d}"
        folder.mkdir(parents=True)
        for i in range(count):
            image = Image.new("RGBA", (10, 6 + i), (0, 0, 0, 0))
            image.putpixel((5, 3), (200, 10 * c, 50, 255))
            image.save(folder / f"img{i}.png" if i % 2 == 0 else folder / f"img{i}.webp")
    (root / "class_00" / "notes.txt").write_text("not an image")


def test_image_folder_loader(tmp_path):
    root = tmp_path / "images"
    write_folder(root, [3, 2, 1, 2, 4, 2, 3, 2, 2])  # class_02 has one image: skipped
    with pytest.warns(UserWarning, match="fewer than 2 images"):
        data = load_image_folder(root, image_size=12, workers=1)
    assert isinstance(data, ImageSet)
    assert list(data.class_names) == [f"class_{c:02d}" for c in (0, 1, 3, 4, 5, 6, 7, 8)]
    assert data.num_train_classes == 4
    assert len(data.images) == 3 + 2 + 2 + 4 + 2 + 3 + 2 + 2
    assert data.images.shape[1:] == (12, 12, 3)
    assert (data.images[:, 0, 0] == 255).all()  # transparent and padding -> white
    assert data.sources[0] == "class_00/img0.png"
    np.testing.assert_array_equal(np.bincount(data.labels), [3, 2, 2, 4, 2, 3, 2, 2])


def test_image_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_image_folder(tmp_path / "missing")
    root = tmp_path / "few"
    write_folder(root, [2, 2, 2])
    with pytest.raises(ValueError, match="at least 4"):
        load_image_folder(root)


def test_imageset_round_trip(tmp_path):
    data = ImageSet(
        images=np.random.default_rng(0).integers(0, 255, (6, 4, 4, 3)),
        labels=[0, 0, 1, 1, 2, 2],
        class_names=["a", "b", "c"],
        sources=list("uvwxyz"),
        num_train_classes=1,
        name="t",
    )
    data.save(tmp_path / "d.npz")
    back = ImageSet.load(tmp_path / "d.npz")
    np.testing.assert_array_equal(back.images, data.images)
    assert back.fingerprint() == data.fingerprint() and list(back.class_names) == ["a", "b", "c"]
    raw = data.images.tobytes() + data.labels.tobytes() + np.array([1]).tobytes()
    assert data.fingerprint() == hashlib.sha256(raw).hexdigest()[:16]  # the key of cached features
    with pytest.raises(ValueError, match="num_train_classes"):
        ImageSet(data.images, data.labels, data.class_names, data.sources, 3)


def test_cache_dir_override(tmp_path, monkeypatch):
    from pml_fieldlosses.app.datasets import CACHE_ENV_VAR, cache_dir

    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "env"))
    assert cache_dir() == (tmp_path / "env").resolve()
    assert cache_dir(tmp_path / "arg") == (tmp_path / "arg").resolve()
    assert Path(cache_dir()).is_dir()


def toy_set(seed=0):
    images = np.random.default_rng(seed).integers(0, 255, (8, 4, 4, 3))
    return ImageSet(images, np.arange(8) % 4, list("abcd"), ["s"] * 8, 2, "toy")


def counting_build(log, seed=0, pause=0.0):
    """A build for ``load_or_build`` that notes each run in ``log``."""

    def build():
        with open(log, "a") as f:
            f.write("built\n")
        time.sleep(pause)
        return toy_set(seed), {"note": "toy"}

    return build


def test_builder_caches_by_key_and_writes_a_record(tmp_path):
    log = tmp_path / "log"
    data = load_or_build(tmp_path / "c", "toy", {"size": 4}, counting_build(log))
    again = load_or_build(tmp_path / "c", "toy", {"size": 4}, counting_build(log))
    assert again.fingerprint() == data.fingerprint() and log.read_text().count("built") == 1
    record = json.loads((tmp_path / "c" / "toy.json").read_text())
    assert record["key"] == {"size": 4} and record["note"] == "toy"
    assert (record["num_images"], record["num_classes"], record["num_train_classes"]) == (8, 4, 2)
    assert record["arrays_sha256"] == sha256_file(tmp_path / "c" / "toy.npz")
    other = load_or_build(tmp_path / "c", "toy", {"size": 5}, counting_build(log, seed=1))  # another key
    assert other.fingerprint() != data.fingerprint() and log.read_text().count("built") == 2
    load_or_build(tmp_path / "c", "toy", {"size": 5}, counting_build(log, seed=1), rebuild=True)
    assert log.read_text().count("built") == 3


@pytest.mark.parametrize("damage", ["truncated", "empty", "wrong-keys", "a-list", "not-a-sha256", "not-text"])
def test_a_bad_build_record_is_named_and_the_entry_rebuilt(tmp_path, damage):
    log = tmp_path / "log"
    data = load_or_build(tmp_path, "toy", {"size": 4}, counting_build(log))
    record = tmp_path / "toy.json"
    text = record.read_text()
    bad = {
        "truncated": text[: len(text) // 2],
        "empty": "",
        "wrong-keys": '{"a": 1}',
        "a-list": "[1, 2]",
        "not-a-sha256": text.replace(json.loads(text)["arrays_sha256"], "x"),
        "not-text": "\udcff",
    }[damage]
    record.write_bytes(bad.encode("utf-8", "surrogateescape"))
    with pytest.warns(UserWarning, match=f"{record} is not a build record"):
        again = load_or_build(tmp_path, "toy", {"size": 4}, counting_build(log))
    assert again.fingerprint() == data.fingerprint() and log.read_text().count("built") == 2
    assert json.loads(record.read_text())["arrays_sha256"] == sha256_file(tmp_path / "toy.npz")


@pytest.mark.parametrize("leftover", ["arrays-only", "record-only", "part-files"])
def test_a_half_written_entry_is_rebuilt(tmp_path, leftover):
    """A build stopped half way (the arrays saved, the record not yet; or the other way
    round; or only .part files) leaves no entry that is read as complete."""
    log = tmp_path / "log"
    load_or_build(tmp_path, "toy", {"size": 4}, counting_build(log))
    arrays, record = tmp_path / "toy.npz", tmp_path / "toy.json"
    if leftover == "arrays-only":
        record.unlink()
    elif leftover == "record-only":
        arrays.unlink()
    else:
        arrays.rename(tmp_path / "toy.npz.part")
        record.rename(tmp_path / "toy.json.part")
    data = load_or_build(tmp_path, "toy", {"size": 4}, counting_build(log, seed=2))
    assert log.read_text().count("built") == 2 and data.fingerprint() == toy_set(2).fingerprint()
    assert (
        load_or_build(tmp_path, "toy", {"size": 4}, counting_build(log)).fingerprint() == data.fingerprint()
    )
    assert log.read_text().count("built") == 2


def test_a_failed_build_leaves_the_entry_unbuilt(tmp_path):
    def broken():
        raise RuntimeError("npm failed")

    with pytest.raises(RuntimeError, match="npm failed"):
        load_or_build(tmp_path, "toy", {"size": 4}, broken)
    assert not (tmp_path / "toy.json").exists()
    load_or_build(tmp_path, "toy", {"size": 4}, counting_build(tmp_path / "log"))


def test_arrays_that_differ_from_their_record_are_refused(tmp_path):
    load_or_build(tmp_path, "toy", {"size": 4}, counting_build(tmp_path / "log"))
    arrays = tmp_path / "toy.npz"
    with open(arrays, "ab") as f:
        f.write(b"x")
    with pytest.raises(IntegrityError, match=f"{arrays} does not match its recorded sha256.*rm '"):
        load_or_build(tmp_path, "toy", {"size": 4}, counting_build(tmp_path / "log"))


def _build_in_process(args):
    root, log = args
    return load_or_build(root, "toy", {"size": 4}, counting_build(log, pause=0.5)).fingerprint()


def test_builders_sharing_a_cache_build_once(tmp_path):
    """Processes that load one entry at once: one builds it under the lock, the others
    wait and read it whole."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(3) as pool:
        prints = pool.map(_build_in_process, [(tmp_path / "c", tmp_path / "log")] * 3)
    assert prints == [toy_set().fingerprint()] * 3
    assert (tmp_path / "log").read_text().count("built") == 1


def test_an_unreadable_package_manifest_is_named_and_fetched_again(registry, tmp_path):
    folder, packages = registry
    npm = install_fake_npm(folder, packages)
    package = packages["emoji-datasource"]
    target, files = fetch_package(package, tmp_path, npm=npm)
    (target / "manifest.json").write_text('{"integrity": ')
    with pytest.warns(UserWarning, match=f"{target / 'manifest.json'} is not a build record"):
        again, files_again = fetch_package(package, tmp_path, npm=npm)
    assert again == target and files_again == files
    packs = [line for line in (folder / "calls.log").read_text().splitlines() if line.startswith("pack")]
    assert len(packs) == 2


def test_built_in_data_sets_are_one_registry_entry_each(tmp_path, monkeypatch):
    from pml_fieldlosses.app import datasets
    from pml_fieldlosses.app.bench import BenchConfig

    assert {"emoji", "icons", "glyphs"} <= set(datasets.DATASETS)
    # the report names every image licence
    assert {"google", "lucide", "roboto-normal", "roboto-italic"} <= set(datasets.SOURCE_LICENSES)
    names = [set(datasets.LICENSES), set(datasets.ICON_LICENSES), set(datasets.GLYPH_LICENSES)]
    assert sum(map(len, names)) == len(datasets.SOURCE_LICENSES)  # no source name in two data sets
    root = tmp_path / "images"
    write_folder(root, [2] * 8)
    assert datasets.load_dataset(str(root), 12).num_classes == 8  # not a name: a folder
    made = ImageSet(np.zeros((8, 4, 4, 3)), np.arange(8) % 4, list("abcd"), ["x"] * 8, 2, "toy")
    seen = []
    monkeypatch.setitem(
        datasets.DATASETS, "toy", (lambda size, cache: seen.append((size, cache)) or made, "toy shapes")
    )
    assert datasets.load_dataset("toy", 12, "here") is made and seen == [(12, "here")]
    assert BenchConfig(data="toy").folder_name().startswith("toy-efficientnet-lite0-64px-")


def _load_in_process(args):
    cache, npm, packages = args
    data = load_emoji(16, cache=cache, npm=npm, packages=packages, workers=1)
    return data.images.tobytes(), data.labels.tolist()


def test_processes_sharing_a_cache_build_it_once_and_read_it_whole(registry, tmp_path):
    """Parallel runs and pb's Ray trials load the same data at once: the first builds it
    under the cache's lock, the others wait and read the finished entry (without the lock,
    one read a half-downloaded tarball and failed its integrity check)."""
    import multiprocessing

    folder, packages = registry
    npm = install_fake_npm(folder, packages)
    cache = tmp_path / "cache"
    with multiprocessing.get_context("fork").Pool(3) as pool:
        loaded = pool.map(_load_in_process, [(cache, npm, packages)] * 3)
    assert all(result == loaded[0] for result in loaded)
    packs = [line for line in (folder / "calls.log").read_text().splitlines() if line.startswith("pack")]
    assert len(packs) == len(packages)  # every package fetched once, by one process


def test_waiting_for_another_process_build_is_said(tmp_path, capfd):
    """A process that finds the cache entry locked by another's build says so on stderr
    (a build takes minutes; a silent wait looks like a hang), then gets the lock."""
    import multiprocessing
    import threading

    from pml_fieldlosses.app.datasets.cache import build_lock

    entry = tmp_path / "entry"
    context = multiprocessing.get_context("fork")
    held, release = context.Event(), context.Event()

    def hold():
        with build_lock(entry):
            held.set()
            release.wait(30)

    holder = context.Process(target=hold)
    holder.start()
    assert held.wait(30)
    threading.Timer(0.5, release.set).start()
    with build_lock(entry):  # the holder has it: said, then waited for
        assert not holder.is_alive() or release.is_set()
    holder.join(30)
    assert f"waiting for another process that is building {entry}" in capfd.readouterr().err
    with build_lock(entry):  # free: nothing said
        pass
    assert "waiting" not in capfd.readouterr().err


# --- faults of the file system: emulated at the Python level (root reads a mode-000 file
# anyway, and a full disk cannot be made on demand), for the files under one folder ---

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class _Metered:
    """A file open for writing on a Disk: its writes take the disk's free bytes."""

    def __init__(self, file, disk):
        self._file, self._disk = file, disk

    def write(self, data):
        size = len(data) if isinstance(data, str) else memoryview(data).nbytes
        allowed = self._disk.take(size)
        if allowed < size:
            self._file.write(
                data[:allowed] if isinstance(data, str) else memoryview(data).cast("B")[:allowed]
            )
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._file.write(data)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()

    def __iter__(self):
        return iter(self._file)


class Disk:
    """The files under ``root`` as a user may meet them, for the code run inside
    ``with Disk(...)``: ``unreadable``: listing ``root`` or opening or stat-ing anything
    under it is refused (EACCES), as for a folder or file of mode 000; ``read_only``:
    every change under it is refused (EROFS); ``free``: the bytes that can still be written
    there, a write past them fails with ENOSPC (after writing what fits), as on a full
    disk; ``fallocate``: whether the file system can reserve space (posix_fallocate)."""

    def __init__(self, root, unreadable=False, read_only=False, free=None, fallocate=True):
        self.root = os.path.abspath(root)
        self.unreadable, self.read_only, self.free, self.fallocate = unreadable, read_only, free, fallocate
        self.fds, self.reserved, self.real = set(), set(), {}

    def inside(self, path, strictly=False):
        if isinstance(path, int):
            return False
        path = os.path.abspath(os.fsdecode(path))
        return path.startswith(self.root + os.sep) or (not strictly and path == self.root)

    def take(self, size):
        """How many of ``size`` bytes fit; they are used."""
        if self.free is None:
            return size
        allowed = min(size, self.free)
        self.free -= allowed
        return allowed

    def refuse(self, code, path):
        raise OSError(code, os.strerror(code), os.fsdecode(path))

    def _open(self, file, mode="r", *args, **kwargs):
        writing = any(c in mode for c in "wax+")
        if self.inside(file) and self.unreadable:
            self.refuse(errno.EACCES, file)
        if self.inside(file) and writing and self.read_only:
            self.refuse(errno.EROFS, file)
        handle = self.real["open"](file, mode, *args, **kwargs)
        return _Metered(handle, self) if self.inside(file) and writing else handle

    def _os_open(self, path, flags, *args, **kwargs):
        if self.inside(path) and self.unreadable:
            self.refuse(errno.EACCES, path)
        if self.inside(path) and flags & WRITE_FLAGS and self.read_only:
            self.refuse(errno.EROFS, path)
        fd = self.real["os.open"](path, flags, *args, **kwargs)
        self.fds.discard(fd)
        self.reserved.discard(fd)
        if self.inside(path) and flags & WRITE_FLAGS:
            self.fds.add(fd)
        return fd

    def _fdopen(self, fd, mode="r", *args, **kwargs):
        handle = self.real["os.fdopen"](fd, mode, *args, **kwargs)
        return _Metered(handle, self) if fd in self.fds and any(c in mode for c in "wax+") else handle

    def _pwrite(self, fd, data, offset):
        size = memoryview(data).nbytes
        if fd in self.fds and fd not in self.reserved and self.take(size) < size:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.real["os.pwrite"](fd, data, offset)

    def _fallocate(self, fd, offset, length):
        if fd in self.fds:
            if not self.fallocate:
                raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
            if self.free is not None and length > self.free:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.take(length)
            self.reserved.add(fd)
        return self.real["os.posix_fallocate"](fd, offset, length)

    def _listing(self, name):
        def listing(path="."):
            if self.inside(path) and self.unreadable:
                self.refuse(errno.EACCES, path)
            return self.real[name](path)

        return listing

    def _stat(self, path, *args, **kwargs):
        if self.inside(path, strictly=True) and self.unreadable:
            self.refuse(errno.EACCES, path)
        return self.real["os.stat"](path, *args, **kwargs)

    def _change(self, name):
        def change(path, *args, **kwargs):
            if self.inside(path) and self.read_only:
                self.refuse(errno.EROFS, path)
            return self.real[name](path, *args, **kwargs)

        return change

    def __enter__(self):
        import builtins

        self.patches = [
            (builtins, "open", self._open),
            (io, "open", self._open),
            (os, "open", self._os_open),
            (os, "fdopen", self._fdopen),
            (os, "pwrite", self._pwrite),
            (os, "posix_fallocate", self._fallocate),
            (os, "listdir", self._listing("os.listdir")),
            (os, "scandir", self._listing("os.scandir")),
            (os, "stat", self._stat),
            *[
                (os, name, self._change(f"os.{name}"))
                for name in ("mkdir", "replace", "rename", "unlink", "rmdir")
            ],
        ]
        for module, name, _ in self.patches:
            key = name if module.__name__ == "builtins" else f"{module.__name__}.{name}"
            key = "open" if name == "open" and module is not os else key
            self.real.setdefault(key, getattr(module, name))
        self.real["os.open"] = os.open
        for module, name, fake in self.patches:
            setattr(module, name, fake)
        return self

    def __exit__(self, *exc):
        for module, name, _ in self.patches:
            key = "open" if name == "open" and module is not os else f"os.{name}"
            setattr(module, name, self.real[key])


def left_over(folder):
    """The unfinished files under ``folder`` (temporary and partial files), by name."""
    return sorted(p.name for p in Path(folder).rglob("*") if ".part" in p.name or p.name.endswith(".tmp"))


@pytest.mark.parametrize("what", ["root", "class folder", "image"])
def test_an_unreadable_folder_or_image_is_named(tmp_path, what):
    root = tmp_path / "images"
    write_folder(root, [2] * 8)
    target = {"root": root, "class folder": root / "class_03", "image": root / "class_03" / "img1.webp"}[what]
    with Disk(target, unreadable=True), pytest.raises(FileFault, match="permission denied") as caught:
        load_image_folder(root, image_size=12, workers=1)
    assert str(target) in str(caught.value)


def test_data_that_is_a_file_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileFault, match=f"--data {tmp_path / 'file'}: it is a file, not a folder"):
        load_image_folder(tmp_path / "file")


def test_a_cache_that_is_a_file_or_read_only_is_named(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    for cache in (tmp_path / "file", tmp_path / "file" / "below"):
        with pytest.raises(FileFault, match=f"{tmp_path / 'file'}.*--cache or \\$PML_FIELDLOSSES_CACHE"):
            cache_dir(cache)
    monkeypatch.setenv("PML_FIELDLOSSES_CACHE", str(tmp_path / "file"))
    with pytest.raises(FileFault, match="it is a file, not a folder"):
        cache_dir()
    with Disk(tmp_path / "ro", read_only=True), pytest.raises(FileFault, match="read-only.*--cache"):
        cache_dir(tmp_path / "ro")
    (tmp_path / "ro").mkdir()
    with (
        Disk(tmp_path / "ro", read_only=True),
        pytest.raises(FileFault, match=f"{tmp_path / 'ro'}.*read-only"),
    ):
        load_or_build(tmp_path / "ro", "toy", {"size": 4}, counting_build(tmp_path / "log"))
    assert not (tmp_path / "log").exists()  # refused before the build: nothing to lose


@pytest.mark.parametrize("where", ["arrays", "record"])
def test_an_unreadable_cache_entry_is_named(tmp_path, where):
    load_or_build(tmp_path, "toy", {"size": 4}, counting_build(tmp_path / "log"))
    target = tmp_path / ("toy.npz" if where == "arrays" else "toy.json")
    with Disk(target, unreadable=True):
        if where == "arrays":
            with pytest.raises(FileFault, match=f"{target}: permission denied"):
                load_or_build(tmp_path, "toy", {"size": 4}, counting_build(tmp_path / "log"))
            with pytest.raises(FileFault, match=f"reading the saved image set {target}"):
                ImageSet.load(target)
        else:  # a record that cannot be read is named and the entry made again
            with pytest.warns(UserWarning, match=f"{target} is not a build record"):
                load_or_build(tmp_path, "toy", {"size": 4}, counting_build(tmp_path / "log"))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(share=st.floats(0, 1, exclude_max=True))
def test_a_full_disk_while_caching_a_data_set_is_named_and_a_rerun_completes(tmp_path_factory, share):
    """The disk fills at any byte of the entry (arrays, then record): a FileFault names the
    cache file and what to do, nothing unfinished is left, and a rerun builds the entry whole."""
    root, whole = tmp_path_factory.mktemp("full"), tmp_path_factory.mktemp("whole")
    log = tmp_path_factory.mktemp("log") / "log"
    load_or_build(whole, "toy", {"size": 4}, counting_build(whole / "log"))
    total = sum((whole / name).stat().st_size for name in ("toy.npz", "toy.json"))
    with Disk(root, free=int(share * total)), pytest.raises(FileFault) as caught:
        load_or_build(root, "toy", {"size": 4}, counting_build(log))
    message = str(caught.value)
    assert str(root) in message and "the disk is full" in message and "--cache" in message
    assert left_over(root) == [] and not (root / "toy.json").exists()
    data = load_or_build(root, "toy", {"size": 4}, counting_build(log))
    assert data.fingerprint() == toy_set().fingerprint() and log.read_text().count("built") == 2
    assert (root / "toy.npz").read_bytes() == (whole / "toy.npz").read_bytes()
    load_or_build(root, "toy", {"size": 4}, counting_build(log))  # complete: read, not built
    assert log.read_text().count("built") == 2


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(share=st.floats(0, 1, exclude_max=True))
def test_a_full_disk_while_unpacking_a_package_is_named_and_a_rerun_completes(
    registry, tmp_path_factory, share
):
    folder, packages = registry
    npm = install_fake_npm(folder, packages)
    package = packages["emoji-datasource-google"]
    whole = tmp_path_factory.mktemp("whole")
    target, files = fetch_package(package, whole, npm=npm)
    total = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    root = tmp_path_factory.mktemp("full")
    with Disk(root / "packages", free=int(share * total)), pytest.raises(FileFault) as caught:
        fetch_package(package, root, npm=npm)
    assert "the disk is full" in str(caught.value) and str(root / "packages") in str(caught.value)
    assert not (root / "packages").exists() or list((root / "packages").iterdir()) == []
    again, files_again = fetch_package(package, root, npm=npm)
    assert (
        files_again == files
        and (again / "manifest.json").read_text() == (target / "manifest.json").read_text()
    )


@pytest.mark.parametrize(
    "files", [{"../../outside": "0" * 64}, {"/etc/passwd": "0" * 64}, {"package/a": "not a sha256"}, {"a": 1}]
)
def test_a_manifest_that_lists_files_wrongly_is_named_and_fetched_again(registry, tmp_path, files):
    folder, packages = registry
    npm = install_fake_npm(folder, packages)
    package = packages["emoji-datasource"]
    target, hashes = fetch_package(package, tmp_path, npm=npm)
    manifest = target / "manifest.json"
    manifest.write_text(json.dumps({"integrity": package.integrity, "files": files}))
    with pytest.warns(UserWarning, match=f"{manifest} is not a build record"):
        again, hashes_again = fetch_package(package, tmp_path, npm=npm)
    assert hashes_again == hashes and json.loads(manifest.read_text())["files"] == hashes


def test_a_modified_package_file_is_named_with_what_to_do(registry, tmp_path):
    folder, packages = registry
    npm = install_fake_npm(folder, packages)
    target, hashes = fetch_package(packages["emoji-datasource"], tmp_path, npm=npm)
    (target / "package" / "emoji.json").write_text("[]")
    with pytest.raises(IntegrityError, match=f"emoji.json was modified.*rm -r '{target}'"):
        fetch_package(packages["emoji-datasource"], tmp_path, npm=npm)
