"""Independent jobs (bench runs, optimisation trials) as Ray tasks, on one machine or a cluster.

Ray does the scheduling, the placement on GPUs and the retries; this module only says what
a job needs and hands its results back in the order they finish:

    ray = cluster.connect(address)                      # None: a local Ray with this machine's resources
    cluster.check_shared_folder(ray, folder)            # every node must see the results folder
    for job, result in cluster.as_completed(ray, run_one, jobs, cluster.resources("cuda")):
        record(job, result)

A worker that dies in the middle of a job (killed, out of memory, node lost) is a *system*
failure: Ray runs the job again, up to ``max_retries`` times, in the same folder, so the
job must resume from what it left there (bench runs and pb experiments do). An exception
raised by the job itself is not retried: it reaches the driver with the job named.
"""

import os
import uuid


def import_ray():
    """Ray, or one line naming the pip command of the cluster extra (pml_fieldlosses._extras)."""
    from ._extras import require

    require("running on Ray", ["cluster"])
    import ray

    return ray


def connect(address=None, num_cpus=None, num_gpus=None):
    """Ray, initialised: joined to the cluster at ``address`` ("auto" for the one this node
    belongs to), or a new local instance with this machine's resources (or the counts given)."""
    ray = import_ray()
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, log_to_driver=False)
    return ray


def resources(device, num_cpus=None, num_gpus=None):
    """Ray task options for one job: one GPU per job with ``device == "cuda"``, otherwise
    CPUs only (one by default; a job on the CPU uses torch's own threads within it)."""
    if device == "cuda":
        return {"num_gpus": 1 if num_gpus is None else num_gpus, "num_cpus": 1 if num_cpus is None else num_cpus}
    if num_gpus:
        raise ValueError(f"num_gpus={num_gpus} needs device 'cuda', got {device!r}")
    return {"num_cpus": 1 if num_cpus is None else num_cpus}


def _read_token(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def check_shared_folder(ray, folder):
    """Refuse, naming the nodes, a results folder that some node of the cluster cannot read:
    the jobs write their results there and the driver reads them back."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(os.path.abspath(folder), f".ray-visibility-{uuid.uuid4().hex}")
    token = uuid.uuid4().hex
    with open(path, "w") as f:
        f.write(token)
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        read = ray.remote(num_cpus=0)(_read_token)
        nodes = [node for node in ray.nodes() if node["Alive"]]
        seen = ray.get([
            read.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(path)
            for node in nodes
        ])
    finally:
        os.remove(path)
    blind = [node["NodeManagerAddress"] for node, value in zip(nodes, seen) if value != token]
    if blind:
        raise SystemExit(
            f"the results folder {os.path.abspath(folder)} is not visible from Ray node(s) {', '.join(blind)}: "
            "put it on storage every node mounts at the same path (NFS, a shared volume)"
        )


class JobFailed(RuntimeError):
    pass


class Tasks:
    """Jobs in flight on Ray: ``submit`` one, ``next_done`` waits for any to finish. For a
    loop that decides what to submit from what finished (e.g. Bayesian optimisation)."""

    def __init__(self, ray, function, options, max_retries=3):
        self.ray, self.max_retries = ray, max_retries
        self.remote = ray.remote(function).options(max_retries=max_retries, **options)
        self.running = {}

    def __len__(self):
        return len(self.running)

    def submit(self, job):
        self.running[self.remote.remote(job)] = job

    def next_done(self, poll=None):
        """(job, result) of the first job to finish; ``poll()`` is called about every second
        while none does. A job's own exception is raised as JobFailed naming the job; a job
        whose worker died more than ``max_retries`` times, too."""
        ray = self.ray
        while True:
            finished, _ = ray.wait(list(self.running), num_returns=1, timeout=1.0)
            if poll is not None:
                poll()
            if finished:
                break
        job = self.running.pop(finished[0])
        try:
            return job, ray.get(finished[0])
        except ray.exceptions.RayTaskError as error:
            raise JobFailed(f"job {job!r} failed: {error.cause!r}") from error.cause
        except ray.exceptions.RayError as error:
            raise JobFailed(f"job {job!r} was lost after {self.max_retries} retries: {error}") from error

    def cancel(self):
        for ref in self.running:
            self.ray.cancel(ref, force=True)
        self.running.clear()


def as_completed(ray, function, jobs, options, max_in_flight=None, max_retries=3, poll=None):
    """Run ``function(job)`` for every job as a Ray task with ``options`` (see ``resources``);
    yield ``(job, result)`` as they finish, at most ``max_in_flight`` running at once (all, by
    default, as the cluster's resources allow). ``poll()`` is called about every second while
    nothing finishes (e.g. to show progress). Closing the generator early cancels what is
    still running."""
    waiting = list(reversed(list(jobs)))
    tasks = Tasks(ray, function, options, max_retries)
    limit = max_in_flight or len(waiting)
    try:
        while waiting or len(tasks):
            while waiting and len(tasks) < limit:
                tasks.submit(waiting.pop())
            yield tasks.next_done(poll)
    finally:
        tasks.cancel()
