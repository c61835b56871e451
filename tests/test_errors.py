"""The shared error helpers of the commands (pml_fieldlosses/app/errors.py)."""

import argparse
import errno
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pml_fieldlosses.app")
from pml_fieldlosses.app import errors  # noqa: E402


def parse(type_, text):
    parser = argparse.ArgumentParser(prog="prog", exit_on_error=False)
    parser.add_argument("--x", type=type_)
    return parser.parse_args([f"--x={text}"]).x


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.integers(-10**12, 10**12).map(str), st.text(max_size=8)))
def test_int_range_accepts_exactly_the_integers_in_range(text):
    try:
        expected = int(text)
    except ValueError:
        expected = None
    if expected is not None and 1 <= expected <= 64:
        assert parse(errors.int_range(1, 64), text) == expected
    else:
        with pytest.raises(argparse.ArgumentError, match="expected an integer from 1 to 64"):
            parse(errors.int_range(1, 64), text)


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=8)))
def test_float_range_accepts_exactly_the_finite_numbers_in_range(text):
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and 0 <= value < 1:
        assert parse(errors.float_range(0, 1, high_open=True), text) == value
    else:
        with pytest.raises(argparse.ArgumentError, match=r"expected a number in \[0, 1\)"):
            parse(errors.float_range(0, 1, high_open=True), text)


def test_file_fault_names_the_path_and_what_to_do(tmp_path):
    fault = errors.file_fault(OSError(errno.ENOSPC, "No space left on device"), tmp_path, "writing")
    assert str(tmp_path) in str(fault) and "disk is full" in str(fault)
    other = errors.file_fault(OSError(errno.EIO, "Input/output error"), tmp_path, "reading")
    assert str(other) == f"reading {tmp_path}: Input/output error"


@pytest.mark.parametrize("fail_at", ["write", "fsync", "replace"])
def test_atomic_write_keeps_the_old_file_when_a_write_fails(tmp_path, monkeypatch, fail_at):
    target = tmp_path / "result.json"
    target.write_text("old")

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if fail_at == "replace":
        monkeypatch.setattr(errors.os, "replace", refuse)
    elif fail_at == "fsync":
        monkeypatch.setattr(errors.os, "fsync", refuse)
    with pytest.raises(errors.FileFault, match="result.json: the disk is full"):
        with errors.atomic_write(target) as f:
            if fail_at == "write":
                refuse()
            f.write("new")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_atomic_write_replaces_the_file_whole(tmp_path):
    target = tmp_path / "result.json"
    with errors.atomic_write(target) as f:
        f.write("new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_atomic_write_leaves_no_temporary_file_on_a_bug(tmp_path):
    target = tmp_path / "result.json"
    with pytest.raises(ZeroDivisionError):
        with errors.atomic_write(target) as f:
            f.write("half")
            1 / 0
    assert list(tmp_path.iterdir()) == []


def test_writable_folder_creates_it_and_refuses_a_file(tmp_path):
    assert errors.writable_folder(tmp_path / "a" / "b", "--out").is_dir()
    (tmp_path / "f").write_text("")
    with pytest.raises(errors.FileFault, match=r"--out .*f: it is a file, not a folder"):
        errors.writable_folder(tmp_path / "f", "--out")
    with pytest.raises(errors.FileFault, match="a part of the path is a file"):
        errors.writable_folder(tmp_path / "f" / "sub", "--out")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only folders")
def test_writable_folder_refuses_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(errors.FileFault, match="--cache: cannot write in .*ro: permission denied"):
            errors.writable_folder(folder, "--cache")
    finally:
        folder.chmod(0o700)


def test_atomic_write_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    target = tmp_path / "result.json"
    with errors.atomic_write(target) as f:
        f.write("new")
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    target.chmod(0o640)
    with errors.atomic_write(target) as f:
        f.write("newer")
    assert target.stat().st_mode & 0o777 == 0o640
