"""Each class of fault the bench meets: bad files read back (truncated, empty,
wrong shape, wrong keys, not an image), duplicate loss names, a killed parent,
Ctrl-C, and the wall time summed over resumed invocations."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from pml_fieldlosses.app import cli
from pml_fieldlosses.app.bench import BenchConfig, pipeline, run_bench
from pml_fieldlosses.app.bench.features import load_cached
from pml_fieldlosses.app.bench.figures import read_embeddings
from pml_fieldlosses.app.bench.result import BenchFileError, RunResult, add_wall_time, read_json
from pml_fieldlosses.app.bench.runs import finished
from pml_fieldlosses.app.datasets import ImageSet, load_image_folder

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
