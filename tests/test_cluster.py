"""pml_fieldlosses.cluster on a local Ray instance: results, retries after a killed worker,
job errors, the shared-folder check."""

import os
import signal

import pytest

ray = pytest.importorskip("ray")

from pml_fieldlosses import cluster  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    started = cluster.connect(num_cpus=2)
    yield started
    ray.shutdown()


def square(job):
    return job * job


def die_once_then_square(job):
    number, marker = job
    if number == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)  # the worker dies in the middle of the job
    return number * number


def fail_on_two(job):
    if job == 2:
        raise ValueError("bad hyperparameters")
    return job


def test_every_job_once_with_two_in_flight(local_ray):
    results = list(cluster.as_completed(local_ray, square, range(6), cluster.resources("cpu"), max_in_flight=2))
    assert sorted(results) == [(n, n * n) for n in range(6)]


def test_a_killed_worker_is_retried_and_its_job_counted_once(local_ray, tmp_path):
    marker = str(tmp_path / "killed")
    jobs = [(n, marker) for n in range(3)]
    results = list(cluster.as_completed(local_ray, die_once_then_square, jobs, cluster.resources("cpu")))
    assert os.path.exists(marker)  # the worker was killed once
    assert sorted(n for (n, _), _ in results) == [0, 1, 2]
    assert dict((n, r) for (n, _), r in results) == {0: 0, 1: 1, 2: 4}


def test_a_job_error_names_the_job_and_is_not_retried(local_ray):
    with pytest.raises(cluster.JobFailed, match="job 2 failed: ValueError"):
        list(cluster.as_completed(local_ray, fail_on_two, [1, 2, 3], cluster.resources("cpu"), max_in_flight=1))


def test_shared_folder_visible_from_every_node(local_ray, tmp_path):
    cluster.check_shared_folder(local_ray, str(tmp_path / "results"))
    assert os.listdir(tmp_path / "results") == []  # the probe file is removed


def test_resources():
    assert cluster.resources("cuda") == {"num_gpus": 1, "num_cpus": 1}
    assert cluster.resources("cpu", num_cpus=4) == {"num_cpus": 4}
    with pytest.raises(ValueError, match="num_gpus=1 needs device 'cuda'"):
        cluster.resources("cpu", num_gpus=1)
