"""The trial executors of pb's Bayesian optimisation (trials.py, parallel.py) run every trial
on a warm runner, built once and kept: in the launcher's process for --parallel_trials 1, on
Ray workers otherwise, with the same code; each trial is timed on its runner; the launcher's
log lines carry their time (bench_parallel_sweep.py reads them). Fakes stand in for pb's
trial runner: no training here (tests/test_benchmarker_run.py runs the real thing)."""

import logging
import re

import pytest

from .pb_support import pb_skip

MISSING, pb_mark = pb_skip("powerful_benchmarker", "torchvision", "ax")
pytestmark = pb_mark
if not MISSING:
    import torch

    from pml_fieldlosses.app.benchmarker import launcher, parallel, trials

# bench_parallel_sweep.py's pattern of a launcher's log line
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \S+ \w+: (.*)$", re.MULTILINE)


class Runner:
    """A trial runner that records what it runs and the torch threads it ran with."""

    def __init__(self):
        self.jobs = []

    def run_trial(self, trial):
        self.jobs.append(("run_trial", trial, torch.get_num_threads()))
        return (0.5, 0.1)

    def reproduce(self, job):
        self.jobs.append(("reproduce", job, torch.get_num_threads()))


class Factory:
    """Counts the trial runners it builds."""

    def __init__(self):
        self.built = []

    def trial_runner(self):
        self.built.append(Runner())
        return self.built[-1]


@pytest.fixture
def threads():
    """Restores torch's threads after the test."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads_asked", [None, 1])
def test_sequential_trials_run_every_job_on_one_warm_runner(threads, threads_asked, caplog):
    factory = Factory()
    executor = trials.SequentialTrials(factory, threads_asked)
    executor.start("folder")
    executor.start("folder")  # idempotent: no second runner
    done = []
    jobs = [("run_trial", "t0"), ("run_trial", "t1"), ("reproduce", ("t1", 0)), ("run_trial", "t2")]
    with caplog.at_level(logging.INFO):
        for method, job in jobs:
            assert executor.free == 1 and len(executor) == 0
            executor.submit(method, job)
            assert executor.free == 0 and len(executor) == 1
            with pytest.raises(RuntimeError):
                executor.submit(method, job)
            done.append(executor.next_done())
    assert len(factory.built) == 1  # built once, kept for every job
    expected_threads = threads if threads_asked is None else threads_asked
    assert factory.built[0].jobs == [(m, j, expected_threads) for m, j in jobs]
    assert [d[:2] for d in done] == [
        ("t0", (0.5, 0.1)),
        ("t1", (0.5, 0.1)),
        (("t1", 0), None),
        ("t2", (0.5, 0.1)),
    ]
    assert all(isinstance(seconds, float) and seconds >= 0 for _, _, seconds in done)  # timed on the runner
    assert sum("The trial runner was built in" in r.getMessage() for r in caplog.records) == 1
    executor.close()
    executor.close()
    assert executor.worker is None


def test_the_ray_worker_is_the_same_warm_runner():
    """One warm-runner code for both executors: the Ray actor adds its folder check only."""
    assert issubclass(parallel.TrialWorker, trials.WarmRunner)
    for method in ("run_trial", "reproduce", "_timed"):
        assert method not in vars(parallel.TrialWorker)


@pytest.mark.parametrize("cpus, expected", [(None, None), ("1", 1), ("2.5", 2), ("0.5", 1)])
def test_trial_cpus_are_the_threads_of_the_trials_without_ray(cpus, expected):
    argv = ["--root_experiment_folder", "exp", "--experiment_name", "x", "--bayes_opt_iters", "2"]
    args, factory = launcher.parse(argv + ([] if cpus is None else ["--trial_cpus", cpus]))
    executor = launcher.trial_executor(args, factory)
    assert isinstance(executor, trials.SequentialTrials) and executor.threads == expected


def test_the_launchers_log_lines_carry_their_time(tmp_path, monkeypatch, capsys):
    """Even when something logged before the launcher set its format up (importing pb does:
    Python's default handler, no time stamps), as on a Ray worker."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    logging.basicConfig(force=True)  # Python's default handler, as pb's import leaves it

    class Logs:
        def run(self):
            logging.getLogger("pml_fieldlosses.app.benchmarker.bayes_opt").info("Optimization iteration 0")

    monkeypatch.setattr(launcher.checks, "check_run", lambda args, factory: None)
    monkeypatch.setattr(launcher, "make_runner", lambda args, factory: Logs())
    try:
        launcher.main(["--root_experiment_folder", str(tmp_path), "--experiment_name", "x"])
        err = capsys.readouterr().err
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    assert LINE.findall(err) == ["Optimization iteration 0"], err


@pytest.mark.parametrize("extra", [[], ["--parallel_trials", "1"]])
def test_trial_gpus_without_ray_is_refused_not_ignored(tmp_path, capsys, extra):
    argv = ["--root_experiment_folder", str(tmp_path), "--experiment_name", "x", "--bayes_opt_iters", "2"]
    with pytest.raises(SystemExit) as exit_info:
        launcher.main([*argv, *extra, "--trial_gpus", "1"])
    assert exit_info.value.code == 2
    assert "argument --trial_gpus: only with Ray" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
