"""The frozen features' cache (bench/features.py): written with plain writes, so that a full
disk is a FileFault naming the file and what to do (never a SIGBUS, as when the features were
written into a memory-mapped file), and a rerun writes it whole; read back validated before
it is mapped (a truncated, damaged or foreign file is named and computed again); a cache
folder that is a file or read-only is named. A tiny trunk stands in for EfficientNet."""

import subprocess
import types
import zipfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pml_fieldlosses.app import backbones
from pml_fieldlosses.app.bench import features
from pml_fieldlosses.app.bench.result import BenchFileError, read_embeddings
from pml_fieldlosses.app.datasets import ImageSet
from pml_fieldlosses.app.errors import FileFault

from .test_datasets import Disk, left_over

FAST = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


class TinyTrunk(torch.nn.Module):
    """The mean and the largest value of each colour: 6 features, fast and exact."""

    out_features = 6
    tap_sizes = [6]

    def forward(self, images):
        return torch.cat([images.mean(dim=(2, 3)), images.amax(dim=(2, 3))], dim=1)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(backbones, "build_frozen_part", lambda name, image_size: TinyTrunk())
    monkeypatch.setattr(features, "CHUNK", 7)  # several writes per view


def toy(n=30):
    images = np.random.default_rng(0).integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)
    return ImageSet(images, np.arange(n) % 6, list("abcdef"), ["s"] * n, 3, "toy")


def views_of(data):
    return {
        0: np.arange(len(data.images)),
        1: np.flatnonzero(data.is_train()),
        2: np.flatnonzero(data.is_train()),
    }


def config(cache):
    return types.SimpleNamespace(cache=str(cache), backbone="efficientnet-lite0", device="cpu", workers=1)


def reference(data):
    return features.compute_views(TinyTrunk(), data.images, views_of(data), torch.device("cpu"), workers=1)


def entry(cache, data):
    return cache / "features" / f"toy-{data.fingerprint()}-lite0-v{features.FEATURES_VERSION}"


def check_whole(cache, data, views):
    expected = reference(data)
    for view, values in expected.items():
        np.testing.assert_array_equal(np.asarray(views[view]), values)
        path = entry(cache, data) / f"view{view}.npy"
        assert features.load_cached(path, *values.shape)[1] is None
        np.testing.assert_array_equal(np.load(path), values)
    assert left_over(cache) == []


def test_the_cache_holds_the_computed_features_as_np_save_writes_them(tiny, tmp_path):
    data = toy()
    views, _, seconds = features.cached_views(data, views_of(data), config(tmp_path))
    assert seconds > 0
    check_whole(tmp_path, data, views)
    for view, values in reference(data).items():  # byte for byte the file np.save writes
        np.save(tmp_path / "saved.npy", values)
        path = entry(tmp_path, data) / f"view{view}.npy"
        assert path.read_bytes() == (tmp_path / "saved.npy").read_bytes()
    again, _, seconds = features.cached_views(data, views_of(data), config(tmp_path))
    assert seconds == 0.0 and all(isinstance(v, np.memmap) for v in again.values())
    check_whole(tmp_path, data, again)


@FAST
@given(share=st.floats(0, 1, exclude_max=True), fallocate=st.booleans())
def test_a_full_disk_is_named_and_a_rerun_writes_the_cache_whole(tiny, tmp_path_factory, share, fallocate):
    """The disk fills at any byte of the views: with a file system that reserves space the
    fault comes before any feature is computed, without one at the write that fills it."""
    data = toy()
    cache = tmp_path_factory.mktemp("cache")
    total = sum(len(features.npy_header(*v.shape)) + v.nbytes for v in reference(data).values())
    with Disk(cache / "features", free=int(share * total), fallocate=fallocate):
        with pytest.raises(FileFault) as caught:
            features.cached_views(data, views_of(data), config(cache))
    message = str(caught.value)
    assert str(entry(cache, data)) in message and "the disk is full" in message
    assert "--cache or $PML_FIELDLOSSES_CACHE" in message
    assert left_over(cache) == [] and not list(entry(cache, data).glob("*.npy"))
    views, _, _ = features.cached_views(data, views_of(data), config(cache))
    check_whole(cache, data, views)


def test_a_cache_that_is_a_file_or_read_only_is_named(tiny, tmp_path):
    data = toy()
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileFault, match=f"{tmp_path / 'file'}: it is a file, not a folder"):
        features.cached_views(data, views_of(data), config(tmp_path / "file"))
    (tmp_path / "ro").mkdir()
    with Disk(tmp_path / "ro", read_only=True), pytest.raises(FileFault, match="read-only.*--cache"):
        features.cached_views(data, views_of(data), config(tmp_path / "ro"))
    features.cached_views(data, views_of(data), config(tmp_path / "ro"))  # writable again: made
    with Disk(tmp_path / "ro" / "features", read_only=True):  # complete, but its lock cannot be taken
        with pytest.raises(FileFault, match="locking the cache entry .*read-only"):
            features.cached_views(data, views_of(data), config(tmp_path / "ro"))


def damage(path, kind, where):
    """Cut ``path`` short, add bytes to it, or overwrite some of it (``where`` in [0, 1))."""
    raw = bytearray(path.read_bytes())
    at = int(where * len(raw))
    if kind == "cut":
        raw = raw[:at]
    elif kind == "longer":
        raw += b"\0" * (1 + at % 9)
    elif kind == "header":
        at = int(where * 128)
        raw[at : at + 4] = b"\xff\x00\x7f\x80"
    else:  # a NaN among the features
        at = 128 + 4 * int(where * (len(raw) - 128) / 4)
        raw[at : at + 4] = np.float32(np.nan).tobytes()
    path.write_bytes(bytes(raw))


@FAST
@given(kind=st.sampled_from(["cut", "longer", "header", "nan"]), where=st.floats(0, 1, exclude_max=True))
def test_a_damaged_cache_file_is_never_mapped_but_named_and_made_again(tiny, tmp_path_factory, kind, where):
    data = toy()
    cache = tmp_path_factory.mktemp("cache")
    features.cached_views(data, views_of(data), config(cache))
    path = entry(cache, data) / "view1.npy"
    before = path.read_bytes()
    damage(path, kind, where)
    if path.read_bytes() == before:  # the header bytes were already these
        return
    loaded, problem = features.load_cached(path, *reference(data)[1].shape)
    assert loaded is None and problem
    messages = []
    file = types.SimpleNamespace(write=messages.append, flush=lambda: None)
    views, _, seconds = features.cached_views(data, views_of(data), config(cache), file=file)
    assert seconds > 0 and f"cached features {path} are bad" in "".join(messages)
    check_whole(cache, data, views)


@pytest.mark.parametrize(
    "header",
    [
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (30, 6), \x00\xff",  # numpy: tokenize.TokenError
        b"{'descr': '<f4', 'fortran_order': False, 'shape': " + b"(" * 3000,  # deep nesting
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (30, 6)} ]",  # SyntaxError
        b"[1, 2, 3]",  # not a dict
    ],
)
def test_any_damaged_header_is_named_not_raised(tmp_path, header):
    """Whatever numpy's header parser raises on damaged bytes, every reader of arrays names
    the file: the feature cache (recomputed), saved test embeddings, a saved image set."""
    text = header.ljust(118, b" ") + b"\n"
    npy = b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + bytes(30 * 6 * 4)
    path = tmp_path / "view0.npy"
    path.write_bytes(npy)
    loaded, problem = features.load_cached(path, 30, 6)
    assert loaded is None and problem.startswith("unreadable (")
    archive = tmp_path / "saved.npz"
    with zipfile.ZipFile(archive, "w") as z:  # stored: the header is parsed before any CRC check
        for name in ("embeddings", "labels", "images"):
            z.writestr(f"{name}.npy", npy)
    with pytest.raises(BenchFileError, match="is not a saved embedding file"):
        read_embeddings(archive, 30)
    with pytest.raises(ValueError, match="is not a saved image set"):
        ImageSet.load(archive)


@pytest.fixture
def small_disk(tmp_path):
    """A real file system of 128 kB (tmpfs), where this machine lets the tests mount one."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small file system here (needs root and permission to mount)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("reserve", [True, False])
def test_a_really_full_disk_is_a_file_fault_not_a_sigbus(tiny, small_disk, tmp_path, monkeypatch, reserve):
    """The features of 1200 images (3 views: 58 kB) on a 128 kB disk with 32 kB free: the
    reservation fails, or (without one) the write that fills the disk; never a SIGBUS."""
    data = toy(1200)
    (small_disk / "ballast").write_bytes(b"\1" * 98304)
    if not reserve:
        monkeypatch.setattr(features, "reserve", lambda fd, size: None)
    with pytest.raises(FileFault, match=f"{small_disk}.*the disk is full.*--cache"):
        features.cached_views(data, views_of(data), config(small_disk))
    assert left_over(small_disk) == []
    (small_disk / "ballast").unlink()
    views, _, _ = features.cached_views(data, views_of(data), config(small_disk))
    check_whole(small_disk, data, views)
