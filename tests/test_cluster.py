"""pml_fieldlosses.app.cluster on a local Ray instance: results, retries after a killed worker,
job errors, the shared-folder check; warm actors (Workers) that keep their state between
jobs, are restarted when killed and run the interrupted job again, once."""

import os
import signal
import time

import pytest

ray = pytest.importorskip("ray")

from pml_fieldlosses.app import cluster, cluster_slots  # noqa: E402
from pml_fieldlosses.app.errors import FileFault  # noqa: E402


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
    results = list(
        cluster.as_completed(local_ray, square, range(6), cluster.resources("cpu"), max_in_flight=2)
    )
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
        list(
            cluster.as_completed(local_ray, fail_on_two, [1, 2, 3], cluster.resources("cpu"), max_in_flight=1)
        )


def test_shared_folder_visible_from_every_node(local_ray, tmp_path):
    cluster.check_shared_folder(local_ray, str(tmp_path / "results"))
    assert os.listdir(tmp_path / "results") == []  # the probe file is removed


def test_a_folder_some_node_cannot_read_is_refused_naming_the_node(local_ray, tmp_path, monkeypatch):
    """An error the caller can catch (the CLI prints it in one line), not an exit."""
    write_token = cluster.write_token
    monkeypatch.setattr(cluster, "write_token", lambda folder: (write_token(folder)[0], "what no node reads"))
    with pytest.raises(cluster.FolderNotShared, match=r"results is not visible from Ray node\(s\) \d"):
        cluster.check_shared_folder(local_ray, str(tmp_path / "results"))
    assert os.listdir(tmp_path / "results") == []


class Counter:
    """An actor that counts its calls (state kept between jobs) and dies once on job 1."""

    def __init__(self, marker):
        self.marker, self.calls = marker, 0

    def square(self, job):
        self.calls += 1
        if job == 1 and self.marker is not None and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # the actor dies in the middle of the job
        if job == 2 and self.marker is None:
            raise ValueError("bad hyperparameters")
        return job * job, self.calls, os.getpid()


def run_all(workers, jobs):
    waiting, results = list(reversed(jobs)), []
    try:
        while waiting or len(workers):
            while waiting and workers.free:
                workers.submit("square", waiting.pop())
            results.append(workers.next_done())
    finally:
        workers.close()
    return results


def test_warm_workers_keep_their_state_between_jobs(local_ray):
    workers = cluster.Workers(local_ray, Counter, ("unused",), 1, cluster.resources("cpu", num_cpus=0.5))
    results = run_all(workers, [0, 2, 3, 4])
    assert [job for job, _ in results] == [0, 2, 3, 4]
    assert [result[:2] for _, result in results] == [
        (0, 1),
        (4, 2),
        (9, 3),
        (16, 4),
    ]  # one actor, its count kept
    assert len({pid for _, (_, _, pid) in results}) == 1


def test_a_killed_warm_worker_is_restarted_and_its_job_run_once(local_ray, tmp_path):
    marker = str(tmp_path / "killed")
    workers = cluster.Workers(local_ray, Counter, (marker,), 2, cluster.resources("cpu", num_cpus=0.5))
    results = run_all(workers, list(range(6)))
    assert os.path.exists(marker)  # an actor was killed once
    assert sorted(job for job, _ in results) == list(range(6))  # every job once
    assert {job: result[0] for job, result in results} == {n: n * n for n in range(6)}
    restarted = dict(results)[1]
    assert restarted[1] == 1  # run again on the restarted actor: its state started afresh


def test_a_warm_worker_job_error_names_the_job(local_ray):
    workers = cluster.Workers(local_ray, Counter, (None,), 1, cluster.resources("cpu", num_cpus=0.5))
    with pytest.raises(cluster.JobFailed, match="job 2 failed: ValueError"):
        run_all(workers, [1, 2, 3])


class SeesTheFolder:
    def __init__(self, token):
        cluster.check_token(*token)

    def square(self, job):
        return job * job


def test_a_worker_that_does_not_see_the_results_folder_stops_naming_its_node(local_ray, tmp_path):
    path, token = cluster.write_token(str(tmp_path / "results"))
    options = cluster.resources("cpu", num_cpus=0.5)
    blind = cluster.Workers(local_ray, SeesTheFolder, ((path, "another machine's token"),), 1, options)
    with pytest.raises(
        cluster.JobFailed,
        match=r"job 3 not run: its worker could not start(.|\n)*"
        r"results folder .*results is not visible from Ray node\(s\) [\d.]+: put it on",
    ):
        run_all(blind, [3])
    assert run_all(cluster.Workers(local_ray, SeesTheFolder, ((path, token),), 1, options), [3]) == [(3, 9)]


def test_slot_cpus_share_the_cluster(local_ray):
    nodes = cluster_slots.alive_nodes(local_ray)
    assert nodes == [(2, 0)]
    assert [cluster_slots.slot_cpus(nodes, k) for k in (1, 2, 4)] == [2, 1, 0.5]


@pytest.mark.parametrize(
    "nodes, slots, gpus, cpus",
    [
        ([(16, 0), (16, 0)], 3, 0, 8),  # 32/3 = 10.67 fits only twice on two 16-CPU nodes
        ([(4, 0), (32, 0)], 4, 0, 8),  # 36/4 = 9 fits 3 times
        ([(4, 0), (32, 0)], 2, 0, 16),  # 18 fits once: both on the 32-CPU node
        ([(8, 2), (8, 2)], 4, 1, 4),
        ([(2, 0)], 3, 0, 0.6666),
    ],
)
def test_slot_cpus_are_the_most_with_which_every_worker_fits(nodes, slots, gpus, cpus):
    assert cluster_slots.slot_cpus(nodes, slots, gpus) == cpus
    assert cluster_slots.how_many_fit(nodes, cpus, gpus) >= slots
    assert (
        cluster_slots.how_many_fit(nodes, cpus + 0.01, gpus) < slots
        or cpus == sum(c for c, _ in nodes) / slots
    )


def test_workers_that_cannot_fit_are_refused_by_name():
    with pytest.raises(
        cluster_slots.SlotsDoNotFit, match=r"4 parallel workers of 1 CPU\(s\) and 1 GPU\(s\) each"
    ):
        cluster_slots.check_fit([(16, 1)], 4, 1, 1)
    with pytest.raises(cluster_slots.SlotsDoNotFit, match="at most 2 do"):
        cluster_slots.slot_cpus([(8, 1), (8, 1)], 3, gpus=1)
    cluster_slots.check_fit([(16, 4)], 4, 4, 1)


def test_workers_that_the_cluster_cannot_place_fail_instead_of_hanging(local_ray):
    """A worker that fits on no node stays pending in Ray: the pool fails after its start
    timeout, naming the request, and leaves no actor behind."""
    with pytest.raises(
        RuntimeError, match=r"of 2 Ray workers \(\{'num_cpus': 1.5\} each\) did not start within 20 s"
    ):
        cluster.Workers(
            local_ray, Counter, ("unused",), 2, cluster.resources("cpu", num_cpus=1.5), start_timeout=20
        )
    # both actors were ended: the cluster's CPUs are free again
    deadline = time.monotonic() + 60
    while local_ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert local_ray.available_resources().get("CPU", 0) == 2


def test_resources():
    assert cluster.resources("cuda") == {"num_gpus": 1, "num_cpus": 1}
    assert cluster.resources("cpu", num_cpus=4) == {"num_cpus": 4}
    with pytest.raises(ValueError, match="num_gpus=1 needs device 'cuda'"):
        cluster.resources("cpu", num_gpus=1)


@pytest.mark.parametrize(
    "address", ["auto", "local", "head:6379", "10.0.0.7:6379", "[::1]:6379", "ray://head:10001"]
)
def test_addresses_ray_takes(address):
    assert cluster.check_address(address) == address


@pytest.mark.parametrize(
    "address", ["", "head", "head:", ":6379", "head:0", "head:65536", "http://head:6379", "a b:1"]
)
def test_other_addresses_are_refused_naming_the_option(address):
    with pytest.raises(ValueError, match=r"argument --ray_address: expected 'auto' .* got"):
        cluster.check_address(address, "--ray_address")


def test_an_address_where_nothing_answers_is_refused_at_once():
    """Ray itself waits minutes for such an address before it fails."""
    start = time.monotonic()
    with pytest.raises(
        cluster.ClusterError, match=r"cannot reach the Ray cluster at 127.0.0.1:1 \(.*\): start it"
    ):
        cluster.check_reachable("127.0.0.1:1")
    assert time.monotonic() - start < cluster.REACH_TIMEOUT
    cluster.check_reachable("auto")  # found by Ray itself


def test_cluster_errors_are_runtime_errors():
    """The bench's CLI prints a RuntimeError in one line."""
    assert issubclass(cluster.ClusterError, RuntimeError) and issubclass(
        cluster.FolderNotShared, cluster.ClusterError
    )


def test_a_results_folder_that_cannot_be_written_is_named(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(FileFault, match=r"a_file/results: a part of the path is a file"):
        cluster.write_token(str(tmp_path / "a_file" / "results"))
