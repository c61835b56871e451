"""Fetch npm packages with the ordinary npm client, verify them, unpack them safely."""

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path, PurePosixPath
from typing import NamedTuple, Optional


class NpmPackage(NamedTuple):
    name: str
    version: str
    # "sha512-<base64>" as the registry publishes it; None: trust the registry's metadata alone
    integrity: Optional[str] = None

    @property
    def spec(self):
        return f"{self.name}@{self.version}"


class UnsafeArchiveError(ValueError):
    """A tar entry that would write outside the destination, or is not a plain file or folder."""


class IntegrityError(ValueError):
    """A downloaded or unpacked file does not have the expected checksum."""


def file_digest(path, algorithm):
    """hashlib's ``algorithm`` digest of a file, read in blocks of 1 MiB."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest


def sha512_integrity(path):
    """The npm-style Subresource Integrity string of a file: "sha512-<base64 digest>"."""
    return "sha512-" + base64.b64encode(file_digest(path, "sha512").digest()).decode("ascii")


def sha256_file(path):
    return file_digest(path, "sha256").hexdigest()


def find_npm(npm="npm"):
    exe = shutil.which(npm)
    if exe is None:
        raise RuntimeError(
            f"'{npm}' (the npm client of Node.js) was not found on PATH. It is needed once, to "
            "download the emoji image packages from the npm registry. Install it (Debian/Ubuntu: "
            "`apt-get install npm`; or from nodejs.org), or run the benchmark on your own images "
            "with `--data PATH/TO/FOLDER`."
        )
    return exe


def run_npm(args, npm="npm", cwd=None):
    exe = find_npm(npm)
    result = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"`npm {' '.join(args)}` failed (exit {result.returncode}):\n{result.stderr.strip()[-2000:]}"
        )
    return result.stdout


def registry_integrity(package, npm="npm"):
    """The sha512 integrity string that the registry's metadata gives for the tarball."""
    out = run_npm(["view", "--json", package.spec, "dist.integrity"], npm=npm)
    value = json.loads(out)
    if isinstance(value, list):  # npm answers with a list when several versions match
        value = value[-1]
    if not isinstance(value, str) or not value.startswith("sha512-"):
        raise IntegrityError(f"the registry gave no sha512 integrity for {package.spec}: {out[:200]!r}")
    return value


def npm_pack(package, dest_dir, npm="npm"):
    """Download ``package``'s tarball into ``dest_dir`` with ``npm pack`` and verify
    its sha512 against npm's report, the registry's metadata and the pinned value.
    Returns the tarball's path."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = run_npm(["pack", "--json", "--pack-destination", str(dest_dir), package.spec], npm=npm)
    report = json.loads(out)[0]
    tarball = dest_dir / report["filename"]
    actual = sha512_integrity(tarball)
    expected = {"npm pack": report["integrity"], "registry metadata": registry_integrity(package, npm)}
    if package.integrity is not None:
        expected["pinned in pml_fieldlosses"] = package.integrity
    for source, value in expected.items():
        if value != actual:
            tarball.unlink()
            raise IntegrityError(
                f"{package.spec}: the tarball's sha512 {actual} differs from the {source} value {value}"
            )
    return tarball


def check_member(member, dest_dir):
    """Refuse absolute names, '..' components, links, devices and anything that
    would land outside ``dest_dir``."""
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError(f"tar entry {name!r} has an absolute path")
    if ".." in parts or "\\" in name:
        raise UnsafeArchiveError(f"tar entry {name!r} points outside the destination ('..' or '\\')")
    if not (member.isfile() or member.isdir()):
        raise UnsafeArchiveError(f"tar entry {name!r} is a link or special file, which is not allowed")
    root = os.path.realpath(dest_dir)
    target = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, target]) != root:
        raise UnsafeArchiveError(f"tar entry {name!r} resolves outside the destination")


def safe_extract(tarball, dest_dir, select=lambda name: True):
    """Unpack the regular files of ``tarball`` whose names pass ``select`` into
    ``dest_dir``. Every entry is checked first (see ``check_member``): one unsafe
    entry refuses the whole archive. Files are written from their content only
    (no modes, owners or links are applied). Returns {relative name: sha256}."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    hashes = {}
    with tarfile.open(tarball, "r:*") as tar:
        members = tar.getmembers()
        for member in members:
            check_member(member, dest_dir)
        for member in members:
            if not member.isfile() or not select(member.name):
                continue
            target = dest_dir / member.name
            target.parent.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256()
            with tar.extractfile(member) as src, open(target, "wb") as out:
                for block in iter(lambda: src.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
            hashes[member.name] = digest.hexdigest()
    return hashes


def verify_files(root, hashes):
    """Check that every file of ``hashes`` ({relative name: sha256}) under ``root`` is
    intact; IntegrityError naming the first that is not, and how to unpack it again."""
    again = f"delete the folder to fetch the package again: rm -r '{root}'"
    for name, expected in hashes.items():
        path = Path(root) / name
        if not path.is_file():
            raise IntegrityError(f"{path} is missing; {again}")
        if sha256_file(path) != expected:
            raise IntegrityError(
                f"{path} was modified: its sha256 differs from the one recorded at unpacking; {again}"
            )
