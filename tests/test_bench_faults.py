"""Each class of fault the bench meets: bad files read back (truncated, empty,
wrong shape, wrong keys, not an image, values out of range), duplicate loss names, two
loss settings in one run folder, a figure that cannot be drawn, a full disk or a read-only
folder at any write, two commands on one folder, a killed parent, Ctrl-C, and the wall
time summed over resumed invocations."""

import builtins
import csv
import dataclasses
import errno
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pml_fieldlosses.app import catalog, cli
from pml_fieldlosses.app.bench import BenchConfig, pipeline, run_bench
from pml_fieldlosses.app.bench.features import load_cached
from pml_fieldlosses.app.bench.figures import read_embeddings
from pml_fieldlosses.app.bench.lock import hold_folders
from pml_fieldlosses.app.bench.result import (
    UNTRAINED,
    BenchFileError,
    RunResult,
    add_wall_time,
    canonical_name,
    read_json,
    run_folder,
    run_name,
)
from pml_fieldlosses.app.bench.runs import finished
from pml_fieldlosses.app.datasets import ImageSet, load_image_folder
from pml_fieldlosses.app.errors import FileFault

from .test_bench import make_folder, tiny_config


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("data") / "shapes")


def a_result(**overrides):
    values = dict(loss="PFML", origin="ours", seed=0, test=None, best_epoch=1, best_val_map_at_r=0.5)
    return RunResult(**{**values, **overrides})


def corrupt(path, kind):
    """Truncate, empty, or rewrite ``path`` with JSON of the wrong keys."""
    if kind == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        path.write_text(json.dumps({"something": "else"}))


@pytest.mark.parametrize("kind", ["truncated", "empty", "wrong-keys"])
def test_bad_result_json_is_named_and_its_run_redone(tmp_path, kind, capsys):
    path = tmp_path / "runs" / "PFML" / "seed0" / "result.json"
    path.parent.mkdir(parents=True)
    a_result().write(path)
    assert RunResult.read(path).as_dict().keys() == a_result().as_dict().keys()
    assert RunResult.read(path).best_val_map_at_r == 0.5 and not list(path.parent.glob("*.part"))
    corrupt(path, kind)
    with pytest.raises(BenchFileError, match=str(path)):
        RunResult.read(path)
    assert finished(tmp_path, [("PFML", 0)], sys.stderr) == {}
    assert f"{path}" in capsys.readouterr().err


def test_bad_protocol_and_wall_time_files_are_named(folder, tmp_path):
    config = tiny_config(folder, tmp_path, losses=("ProxyAnchor",), seeds=1, epochs=1)
    run_bench(config)
    out = next((tmp_path / "out").iterdir())
    for kind in ["truncated", "empty", "wrong-keys"]:
        corrupt(out / "wall_time.json", kind)
        with pytest.raises(BenchFileError, match="wall_time.json"):
            add_wall_time(out, 1.0)
        saved = (out / "protocol.json").read_text()
        corrupt(out / "protocol.json", kind)
        with pytest.raises(RuntimeError, match="protocol.json|other settings"):
            run_bench(config)
        if kind != "wrong-keys":
            with pytest.raises(BenchFileError, match=str(out / "protocol.json")):
                read_json(out / "protocol.json")
        (out / "protocol.json").write_text(saved)


@pytest.mark.parametrize("kind", ["truncated", "empty", "wrong-shape", "wrong-keys"])
def test_bad_embeddings_are_named_not_a_crash(tmp_path, kind):
    path = tmp_path / "test_embeddings.npz"
    keys = ("embeddings", "labels") if kind != "wrong-keys" else ("x", "labels")
    rows = 5 if kind != "wrong-shape" else 4
    np.savez_compressed(path, **{keys[0]: np.zeros((rows, 3), np.float16), keys[1]: np.zeros(rows)})
    if kind in ("truncated", "empty"):
        corrupt(path, kind)
    with pytest.raises(BenchFileError, match=str(path)):
        read_embeddings(path, 5)


@pytest.mark.parametrize("kind", ["truncated", "empty", "wrong-shape", "non-finite"])
def test_bad_feature_cache_is_detected(tmp_path, kind):
    path = tmp_path / "view0.npy"
    features = np.ones((10, 4), np.float32)
    if kind == "wrong-shape":
        features = features[:, :3]
    if kind == "non-finite":
        features[3, 1] = np.nan
    np.save(path, features)
    if kind in ("truncated", "empty"):
        corrupt(path, kind)
    loaded, problem = load_cached(path, 10, 4)
    assert loaded is None and problem
    np.save(path, np.ones((10, 4), np.float32))
    loaded, problem = load_cached(path, 10, 4)
    assert problem is None and loaded.shape == (10, 4)


def test_a_corrupted_feature_cache_is_rebuilt(folder, tmp_path, capsys):
    """The frozen backbone's cache: a truncated view is named and recomputed (same features)."""
    config = tiny_config(folder, tmp_path, backbone="efficientnet-lite0", losses=("CWMS",), seeds=1, epochs=1)
    run_bench(config)
    cached = sorted((tmp_path / "cache" / "features").glob("*/view1.npy"))
    assert len(cached) == 1
    before = np.load(cached[0])
    corrupt(cached[0], "truncated")
    config.out = str(tmp_path / "out2")
    run_bench(config)
    assert f"cached features {cached[0]} are bad" in capsys.readouterr().err
    np.testing.assert_allclose(np.load(cached[0]), before, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["truncated", "empty", "wrong-keys"])
def test_bad_saved_image_set_is_named(tmp_path, kind):
    path = tmp_path / "set.npz"
    images = np.zeros((8, 4, 4, 3), np.uint8)
    ImageSet(images, np.arange(8) % 4, list("abcd"), ["x"] * 8, 2).save(path)
    if kind == "wrong-keys":
        np.savez(path, images=images)
    else:
        corrupt(path, kind)
    with pytest.raises(ValueError, match=str(path)):
        ImageSet.load(path)


def test_a_file_that_is_not_an_image_is_named(folder, tmp_path):
    root = tmp_path / "data"
    make_folder(root)
    bad = root / "shape_03" / "broken.png"
    bad.write_bytes(b"not a png at all")
    with pytest.raises(ValueError, match=f"cannot read the image {bad}"):
        load_image_folder(root, 16, workers=1)


def test_duplicate_loss_names_are_refused(folder, tmp_path, capsys):
    with pytest.raises(ValueError, match="PFML more than once"):
        BenchConfig(losses=("PFML", "CWMS", "PFML"))
    assert cli.main(["bench", "--losses", "PFML,PFML", "--out", str(tmp_path / "x")]) == 2
    assert "PFML more than once" in capsys.readouterr().err


def test_wall_time_sums_every_invocation(folder, tmp_path, monkeypatch):
    config = tiny_config(folder, tmp_path, losses=("ProxyAnchor",), seeds=1, epochs=1)
    run_bench(config)
    out = next((tmp_path / "out").iterdir())
    first = read_json(out / "wall_time.json")["invocations"]
    run_bench(config)  # resumes: nothing to train
    sums = read_json(out / "wall_time.json")
    assert len(sums["invocations"]) == 2 and sums["invocations"][0] == first[0]
    assert sums["total_seconds"] == pytest.approx(sum(sums["invocations"]))
    summary = json.loads((out / "summary.json").read_text())
    # the report counts every invocation up to its writing (the rest of this one is in the file)
    assert sums["invocations"][0] < summary["info"]["wall_seconds"] <= sums["total_seconds"]
    assert "sum of 2 invocation(s)" in (out / "README.md").read_text()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "run_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_bench(config)
    assert len(read_json(out / "wall_time.json")["invocations"]) == 3  # an interrupted one counts too


def test_untrained_row_is_computed_once_for_a_seed_independent_trunk(folder, tmp_path):
    config = tiny_config(folder, tmp_path, backbone="efficientnet-lite0", losses=("CWMS",), seeds=3, epochs=1)
    rows = run_bench(config)
    out = next((tmp_path / "out").iterdir())
    assert [p.name for p in (out / "runs" / "no_training").iterdir()] == ["seed0"]
    assert rows[0]["seeds"] == 3 and rows[0]["mean_average_precision_at_r_ci"] == 0


# a parent that starts the scheduler's workers on slow jobs, then waits to be signalled
PARENT = textwrap.dedent(
    """
    import os, signal, sys, time
    from pml_fieldlosses.app.bench import scheduler

    # as in a terminal, whoever started the tests (a background job inherits SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def job(shared, n, report):
        with open(os.path.join(shared, f"started{n}"), "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)
        return n

    try:
        scheduler.run_jobs(job, sys.argv[1], list(range(6)), workers=2)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    """
)


def start_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("started*"))) < 2:
        assert time.monotonic() < deadline and parent.poll() is None, "the workers never started"
        time.sleep(0.1)
    return parent, [int(p.read_text()) for p in tmp_path.glob("started*")]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split(")")[-1].split()[0] != "Z"


def wait_dead(pids, seconds=10):
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(alive(p) for p in pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_when_the_parent_is_killed(tmp_path):
    parent, workers = start_parent(tmp_path)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert wait_dead(workers), "a worker outlived its SIGKILLed parent"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_stops_running_jobs_and_starts_no_queued_one(tmp_path):
    parent, workers = start_parent(tmp_path)
    start = time.monotonic()
    os.killpg(parent.pid, signal.SIGINT)  # as Ctrl-C in a terminal: the parent and its workers
    out, _ = parent.communicate(timeout=30)
    assert time.monotonic() - start < 10 and "interrupted" in out
    assert wait_dead(workers)
    assert len(list(tmp_path.glob("started*"))) == 2  # the 4 queued jobs never started


def test_a_job_error_reaches_the_parent_and_stops_the_others(tmp_path):
    from pml_fieldlosses.app.bench import scheduler

    def job(shared, n, report):
        report(step=n)
        if n == 1:
            raise ValueError("bad job")
        return n * shared

    seen = []
    assert scheduler.run_jobs(job, 10, [0, 2, 3], workers=2, on_event=lambda *e: seen.append(e)) == [
        0,
        20,
        30,
    ]
    assert ("progress", 2, {"step": 2}) in seen
    with pytest.raises(ValueError, match="bad job"):
        scheduler.run_jobs(job, 10, [0, 1, 2, 3], workers=2)
    torch.set_num_threads(torch.get_num_threads())


def test_the_loss_table_imports_with_the_core_install_only():
    """pml_fieldlosses.app.catalog (the one loss table) pulls in no plotting, logging or bench extra."""
    code = (
        "import sys, pml_fieldlosses.app.catalog as c; assert c.LOSSES; "
        "extras = ('matplotlib', 'tensorboard', 'record_keeper', 'PIL'); "
        "print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in extras or m.startswith('pml_fieldlosses.app.bench')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_on_the_bench_command_keeps_finished_runs_and_resumes(folder, tmp_path):
    argv = ["bench", "--data", str(folder), "--backbone", "convnet", "--image-size", "16", "--seeds", "2"]
    argv += ["--losses", "ProxyAnchor,CWMS,MFCWMS", "--epochs", "60", "--workers", "2"]
    argv += ["--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    code = f"import sys; from pml_fieldlosses.app import cli; sys.exit(cli.main({argv!r}))"
    bench = subprocess.Popen(
        [sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 300
    while not list((tmp_path / "out").glob("*/runs/*/seed*/result.json")):
        assert time.monotonic() < deadline and bench.poll() is None, "no run finished"
        time.sleep(0.2)
    with open(f"/proc/{bench.pid}/task/{bench.pid}/children") as f:
        workers = [int(pid) for pid in f.read().split()]
    start = time.monotonic()
    os.killpg(bench.pid, signal.SIGINT)
    _, err = bench.communicate(timeout=60)
    assert bench.returncode == 130 and "finished runs are kept" in err
    assert time.monotonic() - start < 15 and wait_dead(workers)
    kept = list((tmp_path / "out").glob("*/runs/*/seed*/result.json"))
    assert kept and all(RunResult.read(path) for path in kept)


def test_a_worker_that_dies_is_named_with_its_job():
    from pml_fieldlosses.app.bench import scheduler

    def job(shared, n, report):
        if n == 2:
            os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer would
        return n

    with pytest.raises(RuntimeError, match="running 2 died .*-9"):
        scheduler.run_jobs(job, None, [0, 1, 2, 3], workers=2)


# --- run folders: one per loss setting ------------------------------------------------------------

BASES = ("PFML", "MFCont", "ProxyAnchor", "DRML-CosFace", "Triplet")
NUMBERS = st.one_of(st.integers(-(10**6), 10**6), st.floats(allow_nan=False, allow_infinity=False))


def spellings(value):
    """Ways to write ``value`` that catalog.get_entry reads back as the same number of the same type."""
    if isinstance(value, int):
        return [str(value), f"{value:+d}", f"{'-' if value < 0 else ''}00{abs(value)}"]
    text = repr(value)
    ways = [text, f"{value:.17e}", f" {text} "]
    if text.startswith(("0.", "-0.")):
        ways.append(text.replace("0.", ".", 1))
    return ways


@st.composite
def a_setting(draw):
    """(base, {key: value}) of a loss with settings (none: the plain catalog name)."""
    base = draw(st.sampled_from(BASES))
    keys = draw(st.lists(st.sampled_from(catalog.get_entry(base).keywords()), unique=True, max_size=3))
    return base, {key: draw(NUMBERS) for key in keys}


@st.composite
def spelled(draw, setting):
    """One way of writing ``setting`` as a loss name (any key order, any spelling of the numbers)."""
    base, values = setting
    if not values:
        return base
    items = draw(st.permutations(sorted(values.items())))
    parts = [
        f"{key}{draw(st.sampled_from(['=', ' = ']))}{draw(st.sampled_from(spellings(v)))}" for key, v in items
    ]
    return f"{base}[{','.join(parts)}]"


def identity(setting):
    """What makes two settings the same: the base, and each key's type and exact value (-0.0 is not 0.0)."""
    base, values = setting
    exact = {k: (type(v).__name__, v.hex() if isinstance(v, float) else v) for k, v in values.items()}
    return base, tuple(sorted(exact.items()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_two_settings_never_share_a_run_folder_and_one_setting_has_one(data):
    first = data.draw(a_setting())
    second = first if data.draw(st.booleans()) else data.draw(a_setting())
    a, b = data.draw(spelled(first)), data.draw(spelled(second))
    folder_a, folder_b = run_name(a), run_name(b)
    assert (folder_a == folder_b) == (identity(first) == identity(second)), (a, b, folder_a, folder_b)
    # a folder name is one plain path component that no glob reads as a pattern (PML globs it)
    assert folder_a not in ("", ".", "..") and not set(folder_a) & set("/\\*?[]")
    assert folder_a != run_name(UNTRAINED)
    # the canonical name is a name of the same setting, its own canonical name
    assert canonical_name(canonical_name(a)) == canonical_name(a) and run_name(canonical_name(a)) == folder_a
    entry, again = catalog.get_entry(a), catalog.get_entry(canonical_name(a))
    assert (entry.value, dict(entry.options)) == (again.value, dict(again.options))


def test_the_reported_collisions_get_two_folders_and_two_spellings_one(tmp_path, capsys):
    assert run_name("PFML[delta=.5]") != run_name("PFML[delta= 5]") == run_name("PFML[delta=5]")
    assert run_name("PFML[delta=.5]") == run_name("PFML[delta=0.5]") == "PFML_delta=0.5"
    assert run_name("PFML[delta=1e-3]") != run_name("PFML[delta=1e+3]")
    assert [run_name(n) for n in ("ProxyAnchor", "DRML-ProxyAnchor", UNTRAINED)] == [
        "ProxyAnchor",
        "DRML-ProxyAnchor",
        "no_training",
    ]
    with pytest.raises(ValueError, match="unknown loss"):
        run_name("NoSuchLoss")
    with pytest.raises(ValueError, match=r"PFML\[delta=.5\], PFML\[delta=0.5\] more than once"):
        BenchConfig(losses=("PFML[delta=0.5]", "PFML[delta=.5]"))
    # a run finished under one spelling is the run of the other: read back, named as asked
    a_result(loss="PFML[delta=.5]").write(_result_path(tmp_path, "PFML[delta=.5]"))
    (got,) = finished(tmp_path, [("PFML[delta=0.5]", 0)], sys.stderr).values()
    assert got.loss == "PFML[delta=0.5]"
    assert finished(tmp_path, [("PFML[delta=5]", 0)], sys.stderr) == {}


def _result_path(out, name, seed=0):
    path = run_folder(out, name, seed) / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_a_run_in_an_earlier_versions_folder_is_moved_only_to_its_own_setting(tmp_path, capsys):
    """Earlier versions named PFML[delta=.5] and PFML[delta= 5] both PFML_delta__5."""
    legacy = tmp_path / "runs" / "PFML_delta__5" / "seed0"
    legacy.mkdir(parents=True)
    a_result(loss="PFML[delta=.5]").write(legacy / "result.json")
    assert finished(tmp_path, [("PFML[delta= 5]", 0)], sys.stderr) == {}  # another setting: trained anew
    assert (legacy / "result.json").is_file()
    (got,) = finished(tmp_path, [("PFML[delta=.5]", 0)], sys.stderr).values()
    assert got.loss == "PFML[delta=.5]" and not legacy.exists()
    assert (tmp_path / "runs" / "PFML_delta=0.5" / "seed0" / "result.json").is_file()
    assert "moved from" in capsys.readouterr().err


# --- every file read back is validated ------------------------------------------------------------

# field -> values a result.json may not hold there
BAD_VALUES = {
    "loss": ["", 3, None],
    "origin": ["someone", None],
    "seed": [-1, 1.5, True, "0"],
    "test": [{"mean_average_precision_at_r": 2.0, "precision_at_1": 0.5, "r_precision": 0.5}, [], "x"],
    "best_epoch": [-1, 2.5, None],
    "best_val_map_at_r": [-0.5, 1.5, "0.5", None, math.inf],
    "epochs_run": [-3, "3"],
    "epoch_seconds": [[-1.0], [math.nan], [math.inf], "1", [None]],
    "seconds_per_epoch": [-2.0, math.inf, None],
    "epoch_losses": [["x"], [None], 3],
    "val_history": [{"epoch": [1], "map_at_r": [3.0]}, {"epoch": [-1], "map_at_r": [0.5]}, {"epoch": [1]}],
    "label_noise": [{"fraction": 1.0, "changed": 0, "of": 0}, {"fraction": 0.1, "changed": 5, "of": 2}, {}],
    "clipped_fraction": [{"embedder": 2.0}, {"embedder": math.nan}, []],
    "run_seconds": [-1.0, math.nan, math.inf, None],
    "proxy_distance": [-0.1, math.nan, "near"],
}


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(sorted(BAD_VALUES)).flatmap(
        lambda k: st.tuples(st.just(k), st.sampled_from(BAD_VALUES[k]))
    )
)
def test_a_result_json_with_a_bad_value_is_named_and_its_run_redone(tmp_path_factory, bad):
    key, value = bad
    out = tmp_path_factory.mktemp("out")
    path = _result_path(out, "PFML")
    test = {"mean_average_precision_at_r": 0.5, "precision_at_1": 0.6, "r_precision": 0.4}
    good = a_result(
        test=test, epochs_run=2, epoch_seconds=[0.1, 0.2], seconds_per_epoch=0.15, epoch_losses=[1.0, 0.5]
    )
    good.write(path)
    assert RunResult.read(path) == good
    path.write_text(json.dumps({**good.as_dict(), key: value}))
    with pytest.raises(BenchFileError, match=f"{re.escape(str(path))} is not a run result.*{key}"):
        RunResult.read(path)
    assert finished(out, [("PFML", 0)], io.StringIO()) == {}


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0, 1e6), max_size=4),
    st.sampled_from([-1.0, -1e-9, math.nan, math.inf, -math.inf, True, "3", None, [1.0]]),
    st.data(),
)
def test_a_wall_time_json_with_a_bad_duration_is_refused_by_name(tmp_path_factory, good, bad, data):
    out = tmp_path_factory.mktemp("out")
    invocations = list(good)
    invocations.insert(data.draw(st.integers(0, len(good))), bad)
    (out / "wall_time.json").write_text(json.dumps({"invocations": invocations, "total_seconds": 1.0}))
    with pytest.raises(BenchFileError, match=f"{re.escape(str(out / 'wall_time.json'))} is bad: .*rm "):
        add_wall_time(out, 1.0)
    (out / "wall_time.json").write_text(json.dumps({"invocations": good, "total_seconds": sum(good) + 5}))
    with pytest.raises(BenchFileError, match="not the sum"):
        add_wall_time(out, 1.0)
    (out / "wall_time.json").write_text(json.dumps({"invocations": good, "total_seconds": sum(good)}))
    assert add_wall_time(out, 1.0) == (pytest.approx(sum(good) + 1.0), len(good) + 1)


def test_non_finite_or_foreign_embeddings_are_named(tmp_path):
    path = tmp_path / "test_embeddings.npz"
    labels = np.arange(5)
    np.savez_compressed(path, embeddings=np.full((5, 3), np.nan, np.float16), labels=labels)
    with pytest.raises(BenchFileError, match=f"{re.escape(str(path))} holds 5 of 5 test embeddings with NaN"):
        read_embeddings(path, 5, labels)
    assert read_embeddings(path, 5, labels, finite=False)[0].shape == (5, 3)  # a diverged model's: kept
    np.savez_compressed(path, embeddings=np.zeros((5, 3), np.float16), labels=labels[::-1])
    with pytest.raises(BenchFileError, match="labels of other test images"):
        read_embeddings(path, 5, labels)


@pytest.mark.parametrize("kind", ["truncated", "missing", "foreign"])
def test_a_tested_run_without_valid_embeddings_is_redone(tmp_path, kind, capsys):
    path = _result_path(tmp_path, "PFML")
    test = {"mean_average_precision_at_r": 0.5, "precision_at_1": 0.6, "r_precision": 0.4}
    a_result(test=test).write(path)
    embeddings = path.parent / "test_embeddings.npz"
    labels = np.arange(5)
    np.savez_compressed(embeddings, embeddings=np.zeros((5, 3), np.float16), labels=labels)
    assert list(finished(tmp_path, [("PFML", 0)], sys.stderr, labels)) == [("PFML", 0)]
    if kind == "missing":
        embeddings.unlink()
    elif kind == "foreign":
        np.savez_compressed(embeddings, embeddings=np.zeros((4, 3), np.float16), labels=labels[:4])
    else:
        corrupt(embeddings, kind)
    assert finished(tmp_path, [("PFML", 0)], sys.stderr, labels) == {}
    assert f"{embeddings}" in capsys.readouterr().err


# --- the figures are an extra ---------------------------------------------------------------------


def one_image_test_classes(root):
    """The test folder's classes with copies of one image (its training classes as they are)."""
    make_folder(root)
    image = root / "shape_06" / "0.png"
    for c in range(6, 12):
        for i in range(4):
            target = root / f"shape_{c:02d}" / f"{i}.png"
            if target != image:
                shutil.copy(image, target)
    return root


def test_a_figure_that_cannot_be_drawn_is_skipped_and_the_report_written(tmp_path, capsys):
    data = one_image_test_classes(tmp_path / "same")
    config = tiny_config(
        data, tmp_path, backbone="convnet", image_size=16, losses=("ProxyAnchor",), seeds=1, epochs=1
    )
    rows = run_bench(config)
    out = next((tmp_path / "out").iterdir())
    err = capsys.readouterr().err
    assert "warning: figure embedding_map.png skipped: ValueError: the test embeddings" in err
    assert [r["loss"] for r in rows] == [UNTRAINED, "ProxyAnchor"]
    for name in ("results.csv", "summary.json", "learning_curves.png", "retrieval_grid.png"):
        assert (out / name).stat().st_size > 0, name
    readme = (out / "README.md").read_text()
    assert "| ProxyAnchor |" in readme and "Figures not drawn: `embedding_map.png` (ValueError:" in readme
    assert not (out / "embedding_map.png").exists()

    # embeddings that are not finite (a damaged file, a diverged model): named, the figures skipped
    embeddings = out / "runs" / "ProxyAnchor" / "seed0" / "test_embeddings.npz"
    with np.load(embeddings) as saved:
        labels = saved["labels"]
    np.savez_compressed(embeddings, embeddings=np.full((len(labels), 8), np.nan, np.float16), labels=labels)
    run_bench(config)
    err = capsys.readouterr().err
    assert f"figure retrieval_grid.png skipped: {embeddings} holds {len(labels)} of {len(labels)}" in err
    assert "Figures not drawn: `retrieval_grid.png`" in (out / "README.md").read_text()


# --- a full disk or a read-only folder at any write ------------------------------------------------


class FullDisk:
    """Every write under ``root`` (opening a file to write, creating a folder, os.replace,
    torch.save) from the ``fail_at``-th on fails with ``code`` (default ENOSPC), as on a disk
    that fills up (or a folder made read-only); ``fail_at`` None: none fails, they are
    counted. Then torch.save fails as it does on a full disk (a RuntimeError from its
    writer) and os.statvfs says the disk is full or read-only."""

    def __init__(self, root, fail_at=None, code=errno.ENOSPC):
        self.root, self.fail_at, self.code, self.count = os.fspath(root), fail_at, code, 0

    def under(self, path):
        return not isinstance(path, int) and os.fsdecode(path).startswith(self.root)

    def hit(self, path, error=OSError):
        if not self.under(path):
            return
        self.count += 1
        if self.failed:
            if error is OSError:
                raise OSError(self.code, os.strerror(self.code), os.fsdecode(path))
            raise error(f"[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0 ({path})")

    @property
    def failed(self):
        return self.fail_at is not None and self.count > self.fail_at

    def install(self, mp):
        real_open, real_os_open, real_replace, real_mkdir = builtins.open, os.open, os.replace, os.mkdir
        real_save, real_statvfs = torch.save, os.statvfs

        def open_(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax+"):
                self.hit(file)
            return real_open(file, mode, *args, **kwargs)

        def os_open(path, flags, *args, **kwargs):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                self.hit(path)
            return real_os_open(path, flags, *args, **kwargs)

        def replace(src, dst, *args, **kwargs):
            self.hit(dst)
            return real_replace(src, dst, *args, **kwargs)

        def mkdir(path, *args, **kwargs):
            self.hit(path)
            return real_mkdir(path, *args, **kwargs)

        def save(obj, f, *args, **kwargs):
            if isinstance(f, (str, os.PathLike)):
                self.hit(f, RuntimeError if self.code == errno.ENOSPC else OSError)
            return real_save(obj, f, *args, **kwargs)

        def statvfs(path):
            stats = real_statvfs(path)
            if not (self.failed and (self.under(path) or self.root.startswith(os.fsdecode(path)))):
                return stats  # another file system than the one that filled up
            values = list(stats)
            if self.code == errno.ENOSPC:
                values[3] = values[4] = 0  # f_bfree, f_bavail
            elif self.code == errno.EROFS:
                values[8] |= os.ST_RDONLY  # f_flag
            return os.statvfs_result(values)

        mp.setattr(builtins, "open", open_)
        mp.setattr(io, "open", open_)
        mp.setattr(os, "open", os_open)
        mp.setattr(os, "replace", replace)
        mp.setattr(os, "mkdir", mkdir)
        mp.setattr(os, "statvfs", statvfs)
        mp.setattr(torch, "save", save)


def quick_map(mp):
    """A t-SNE-free 2-D map (seconds saved per bench; the figure is still written)."""
    from pml_fieldlosses.app.bench import plots

    mp.setattr(plots, "embedding_map", lambda labels, embeddings, path: plots.save(plots.plt.figure(), path))


def outcome(out):
    """What a finished bench folder holds, without its timings: every run's result, the
    table, the figures, the report's sections, and the number of invocations counted."""
    (folder,) = out.iterdir()
    keys = (
        "loss",
        "seed",
        "test",
        "best_epoch",
        "best_val_map_at_r",
        "epochs_run",
        "epoch_losses",
        "val_history",
    )
    runs = {
        p.relative_to(folder).as_posix(): {k: RunResult.read(p).as_dict()[k] for k in keys}
        for p in sorted(folder.glob("runs/*/seed*/result.json"))
    }
    with open(folder / "results.csv") as f:
        table = [{k: v for k, v in row.items() if "seconds" not in k} for row in csv.DictReader(f)]
    figures = sorted(p.name for p in folder.glob("*.png") if p.stat().st_size > 0)
    readme = [line for line in (folder / "README.md").read_text().splitlines() if line.startswith("#")]
    summary = json.loads((folder / "summary.json").read_text())["rows"]
    return runs, table, figures, readme, [{k: v for k, v in r.items() if "seconds" not in k} for r in summary]


def fault_config(folder, tmp, cache):
    return tiny_config(
        folder,
        tmp,
        backbone="convnet",
        image_size=16,
        embedding_size=8,
        losses=("ProxyAnchor",),
        seeds=1,
        epochs=1,
        cache=str(cache),
    )


@pytest.fixture(scope="module")
def full_disk_reference(folder, tmp_path_factory):
    """A clean run's outcome and how many writes it makes under --out."""
    tmp = tmp_path_factory.mktemp("reference")
    config = fault_config(folder, tmp, tmp / "cache")
    disk = FullDisk(tmp / "out")
    with pytest.MonkeyPatch.context() as mp:
        quick_map(mp)
        disk.install(mp)
        run_bench(config)
    return config, disk.count, outcome(tmp / "out")


@pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnhandledThreadExceptionWarning"
)  # tensorboard's writer thread
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_a_full_disk_at_any_write_is_named_and_a_rerun_completes_the_same_results(
    full_disk_reference, tmp_path_factory, data
):
    """The disk fills up at a write drawn among all those of a bench (the protocol, the lock,
    each run's records, models, embeddings and result, the wall time, the table, the figures,
    the report): a FileFault names a path under --out and says the disk is full, and the same
    command run again (the disk freed) ends with the results of a bench that never failed."""
    reference, writes, expected = full_disk_reference
    fail_at = data.draw(st.integers(0, writes - 1), label="failing write")
    tmp = tmp_path_factory.mktemp("full")
    config = dataclasses.replace(reference, out=str(tmp / "out"))
    disk = FullDisk(tmp / "out", fail_at)
    with pytest.MonkeyPatch.context() as mp:
        quick_map(mp)
        disk.install(mp)
        with pytest.raises(FileFault) as fault:
            run_bench(config)
    assert disk.failed and "the disk is full" in str(fault.value) and str(tmp / "out") in str(fault.value)
    with pytest.MonkeyPatch.context() as mp:
        quick_map(mp)
        run_bench(config)
    assert outcome(tmp / "out") == expected
    assert not [p for p in (tmp / "out").rglob("*") if p.name.endswith((".tmp", ".part"))]


def test_a_full_disk_when_a_run_makes_its_model_folder_leaves_no_writer_running(folder, tmp_path):
    """A run's TensorBoard writer (and its thread) is made before PML's hooks make the run's
    model folder: a full disk there is named, and the writer's thread ends with the run."""
    config = fault_config(folder, tmp_path, tmp_path / "cache")
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if os.path.basename(os.fsdecode(path)) == "models":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fsdecode(path))
        return real_mkdir(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        quick_map(mp)
        mp.setattr(os, "mkdir", mkdir)
        with pytest.raises(FileFault, match="models"):
            run_bench(config)
    assert not [t for t in threading.enumerate() if type(t).__name__ == "_AsyncWriterThread"]


@pytest.mark.parametrize(
    "code, advice",
    [(errno.EROFS, "read-only"), (errno.EACCES, "permission denied"), (errno.ENOSPC, "disk is full")],
)
def test_a_read_only_or_full_out_folder_is_one_line_and_exit_1(folder, tmp_path, capsys, code, advice):
    argv = ["bench", "--data", str(folder), "--backbone", "convnet", "--image-size", "16", "--seeds", "1"]
    argv += ["--losses", "ProxyAnchor", "--epochs", "1", "--workers", "1", "--embedding-size", "8"]
    argv += ["--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    with pytest.MonkeyPatch.context() as mp:
        FullDisk(tmp_path / "out", 0, code).install(mp)
        assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and advice in err[0] and str(tmp_path / "out") in err[0], err


# --- one command at a time in a results folder ----------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pml_fieldlosses.app.bench.lock import hold_folders

    with hold_folders(sys.argv[1:]):
        print("held", flush=True)
        time.sleep(120)
    """
)


def test_a_second_command_on_a_folder_in_use_stops_at_once_naming_the_process(folder, tmp_path, capsys):
    """Another process holds the results folders of a bench, of a selection and of the
    claims: each command stops before loading any data, naming the folder and that
    process; when it dies (killed, no clean-up) the folders are free."""
    from pml_fieldlosses.app.bench.pipeline import Part
    from pml_fieldlosses.app.bench.selection import select
    from pml_fieldlosses.app.claims import claims_config, run_claims
    from pml_fieldlosses.app.claims.run import report_folder
    from pml_fieldlosses.app.claims.table import get_claims

    config = tiny_config(folder, tmp_path, losses=("ProxyAnchor",), seeds=1, epochs=1)
    claims = claims_config(data=str(folder), image_size=32, embedding_size=16, out=str(tmp_path / "claims"))
    argv = ["bench", "--data", str(folder), "--image-size", "32", "--embedding-size", "16", "--seeds", "1"]
    argv += ["--epochs", "1", "--losses", "ProxyAnchor", "--out", str(tmp_path / "cli")]
    folders = [Part(config).folder, Part(config, selection=True).folder]
    folders.append(report_folder(claims, get_claims(["pfml-beats-cpml"])))
    cli_config = BenchConfig(data=str(folder), image_size=32, embedding_size=16, seeds=1, epochs=1)
    folders.append(Part(dataclasses.replace(cli_config, out=str(tmp_path / "cli"))).folder)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *map(str, folders)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        for folder_in_use, command in zip(
            folders,
            [
                lambda: run_bench(config),
                lambda: select(config),
                lambda: run_claims(claims, ["pfml-beats-cpml"]),
            ],
        ):
            message = f"{folder_in_use} is in use by another pml-fieldlosses command (process {holder.pid})"
            with pytest.raises(FileFault, match=re.escape(message)):
                command()
        assert time.monotonic() - start < 10  # at once: no data loaded, nothing trained
        capsys.readouterr()
        code = cli.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert (
            code == 1
            and len(err) == 1
            and f"{folders[3]} is in use" in err[0]
            and f"process {holder.pid}" in err[0]
        ), err
        assert sorted(p.name for p in folders[0].iterdir()) == [".lock"]  # nothing written
    finally:
        holder.kill()
        holder.wait()
    with hold_folders(folders):  # a killed holder leaves no stale lock
        pass


@pytest.mark.parametrize("code, advice", [(errno.EROFS, "read-only"), (errno.EACCES, "log.txt says why")])
def test_a_best_model_that_could_not_be_saved_is_named_not_tested_silently(folder, tmp_path, code, advice):
    """PML only logs a warning when it cannot save a model: the run must not test the
    last epoch's model (or none) as the best one's."""
    from pml_fieldlosses.app.bench.pipeline import Part

    config = fault_config(folder, tmp_path, tmp_path / "cache")
    models = run_folder(Part(config).folder, "ProxyAnchor", 0) / "models"
    with pytest.MonkeyPatch.context() as mp:
        quick_map(mp)
        FullDisk(models / "embedder_best", 0, code).install(mp)
        with pytest.raises(
            FileFault, match=f"{re.escape(str(models))}/embedder_best1.pth, the model of the best"
        ) as e:
            run_bench(config)
    assert advice in str(e.value)
    assert not (models.parent / "result.json").exists()
