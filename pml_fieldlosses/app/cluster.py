"""Independent jobs (bench runs, optimisation trials) as Ray tasks or on warm Ray actors,
on one machine or a cluster.

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

A task starts in a fresh worker process each time it is retried and imports what it needs
on every start. Where jobs are short beside that start-up (the trials of a sweep: torch,
pb and ax imported, the runner built, the dataset loaded), ``Workers`` keeps one long-lived
actor per slot that loads all that once and runs the jobs one after another; a killed
actor is restarted by Ray and the job it was running is run again there, as for a task.
"""

import os
import re
import socket
import uuid

from .errors import UsageError, file_fault

# a Ray address: HOST:PORT (a name, an IPv4 address or a bracketed IPv6 one), or a Ray
# client's ray://HOST:PORT
ADDRESS = re.compile(
    r"^(?P<client>ray://)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})$"
)
ADDRESS_FORMS = "'auto' (the cluster this node belongs to), 'local' (a new Ray instance here), HOST:PORT or ray://HOST:PORT"
# seconds to wait for a cluster's port to answer before saying it cannot be reached
REACH_TIMEOUT = 10


class ClusterError(RuntimeError):
    """The Ray cluster cannot be reached or used as asked (one line naming it)."""


def check_address(address, option="--ray-address"):
    """``address`` as ``connect`` takes it: 'auto', 'local', HOST:PORT or ray://HOST:PORT
    (port 1 to 65535); a UsageError naming ``option`` otherwise."""
    match = ADDRESS.fullmatch(address)
    if address in ("auto", "local") or (match and 1 <= int(match["port"]) <= 65535):
        return address
    raise UsageError(f"argument {option}: expected {ADDRESS_FORMS} (port 1 to 65535), got {address!r}")


def check_reachable(address):
    """Refuse (ClusterError) a HOST:PORT where nothing answers: Ray itself would wait
    minutes for it before failing."""
    match = ADDRESS.fullmatch(address)
    if match is None:
        return
    host, port = match["host"].strip("[]"), int(match["port"])
    try:
        socket.create_connection((host, port), timeout=REACH_TIMEOUT).close()
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        raise ClusterError(
            f"cannot reach the Ray cluster at {address} ({reason}): start it there (ray start --head "
            f"--port {port}) or check the address (ray status on the head node shows it)"
        ) from None


def import_ray():
    """Ray, or one line naming the pip command of the cluster extra (pml_fieldlosses.app.extras)."""
    from .extras import require

    require("running on Ray", ["cluster"])
    import ray

    return ray


def connect(address=None, num_cpus=None, num_gpus=None):
    """Ray, initialised: joined to the cluster at ``address`` ("auto" for the one this node
    belongs to, "local" for a new local instance), or a new local instance with this
    machine's resources (or the counts given). A cluster that cannot be reached or joined
    is a ClusterError naming the address."""
    ray = import_ray()
    if not ray.is_initialized():
        if address:
            check_address(address)
            check_reachable(address)
            try:
                ray.init(address=address, log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                hint = (
                    "start one with ray start --head, or give HOST:PORT"
                    if address == "auto"
                    else "check the address"
                )
                raise ClusterError(f"cannot join the Ray cluster at {address!r}: {first}; {hint}") from e
        else:
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, log_to_driver=False)
    return ray


def resources(device, num_cpus=None, num_gpus=None):
    """Ray task options for one job: one GPU per job with ``device == "cuda"``, otherwise
    CPUs only (one by default; a job on the CPU uses torch's own threads within it)."""
    if device == "cuda":
        return {
            "num_gpus": 1 if num_gpus is None else num_gpus,
            "num_cpus": 1 if num_cpus is None else num_cpus,
        }
    if num_gpus:
        raise ValueError(f"num_gpus={num_gpus} needs device 'cuda', got {device!r}")
    return {"num_cpus": 1 if num_cpus is None else num_cpus}


def _read_token(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def write_token(folder):
    """A new token file in the results folder: ``(path, token)``, for ``check_token`` on the
    nodes (the caller removes the file). A folder that cannot be written is a FileFault."""
    path = os.path.join(os.path.abspath(folder), f".ray-visibility-{uuid.uuid4().hex}")
    token = uuid.uuid4().hex
    try:
        os.makedirs(folder, exist_ok=True)
        with open(path, "w") as f:
            f.write(token)
    except OSError as e:
        raise file_fault(e, folder, "writing the Ray visibility token in") from e
    return path, token


def not_shared(folder, nodes):
    return (
        f"the results folder {folder} is not visible from Ray node(s) {', '.join(nodes)}: "
        "put it on storage every node mounts at the same path (NFS, a shared volume)"
    )


class FolderNotShared(ClusterError):
    """The results folder is not visible from some Ray node."""


def check_token(path, token):
    """In a job or an actor: refuse, naming this node, a results folder it does not see (the
    token file ``write_token`` made on the driver is missing or different here)."""
    if _read_token(path) != token:
        import ray

        raise FolderNotShared(not_shared(os.path.dirname(path), [ray.util.get_node_ip_address()]))


def check_shared_folder(ray, folder):
    """Refuse, naming the nodes, a results folder that some node of the cluster cannot read:
    the jobs write their results there and the driver reads them back."""
    path, token = write_token(folder)
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        read = ray.remote(num_cpus=0)(_read_token)
        nodes = [node for node in ray.nodes() if node["Alive"]]
        seen = ray.get(
            [
                read.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
                ).remote(path)
                for node in nodes
            ]
        )
    finally:
        os.remove(path)
    blind = [node["NodeManagerAddress"] for node, value in zip(nodes, seen) if value != token]
    if blind:
        raise FolderNotShared(not_shared(os.path.abspath(folder), blind))


class JobFailed(RuntimeError):
    pass


def first_finished(ray, refs, poll=None):
    """The first of ``refs`` (Ray object refs) to finish; ``poll()`` is called about every
    second while none does."""
    while True:
        finished, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
        if poll is not None:
            poll()
        if finished:
            return finished[0]


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
        finished = first_finished(ray, self.running, poll)
        job = self.running.pop(finished)
        try:
            return job, ray.get(finished)
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


class Workers:
    """``count`` long-lived Ray actors of ``actor_class`` (built with ``args``; Ray resource
    ``options`` each), which keep what they loaded (imports, data, a built runner) between
    the jobs they run one at a time: ``submit(method, job)`` calls ``actor.method(job)`` on
    an idle actor, ``next_done`` waits for any call to finish and makes its actor idle again.

    An actor killed in the middle of a job is restarted by Ray (its ``__init__`` runs again)
    and the call is run again there, up to ``max_retries`` times, as for a task: the job must
    resume from what it left in its folder. An actor whose ``__init__`` raises is not
    restarted: the job sent to it fails with that error. The actors are created at once and
    the constructor returns once all have started (loaded side by side), or fails naming
    those Ray could not place within ``start_timeout`` seconds; ``close`` ends them."""

    def __init__(self, ray, actor_class, args, count, options, max_retries=3, start_timeout=600):
        self.ray, self.max_retries = ray, max_retries
        remote = ray.remote(actor_class).options(max_restarts=-1, max_task_retries=max_retries, **options)
        self.actors = [remote.remote(*args) for _ in range(count)]
        self.idle = list(self.actors)
        self.running = {}
        self._wait_until_started(options, start_timeout)

    def _wait_until_started(self, options, timeout):
        """Ray leaves an actor that fits on no node pending forever, and jobs sent to it
        would never run: fail, naming them, if some have not started within ``timeout``
        seconds (an actor whose __init__ raised has started; its job reports the error)."""
        refs = [actor.__ray_ready__.remote() for actor in self.actors]
        _, pending = self.ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if pending:
            self.close()
            raise ClusterError(
                f"{len(pending)} of {len(refs)} Ray workers ({options} each) did not start within "
                f"{timeout:g} s: the cluster has no room for them (ray status shows pending demands)"
            )

    def __len__(self):
        return len(self.running)

    @property
    def free(self):
        return len(self.idle)

    def submit(self, method, job):
        if not self.idle:
            raise RuntimeError(f"no idle worker for {method}({job!r}): {len(self.running)} jobs running")
        actor = self.idle.pop(0)
        self.running[getattr(actor, method).remote(job)] = (job, actor)

    def next_done(self, poll=None):
        """(job, result) of the first call to finish, as ``Tasks.next_done``."""
        ray = self.ray
        finished = first_finished(ray, self.running, poll)
        job, actor = self.running.pop(finished)
        self.idle.append(actor)
        try:
            return job, ray.get(finished)
        except ray.exceptions.RayTaskError as error:
            raise JobFailed(f"job {job!r} failed: {error.cause!r}") from error.cause
        except ray.exceptions.RayActorError as error:
            if error.actor_init_failed:  # __init__ raised: Ray does not restart such an actor
                raise JobFailed(f"job {job!r} not run: its worker could not start: {error}") from error
            raise JobFailed(f"job {job!r} was lost after {self.max_retries} retries: {error}") from error
        except ray.exceptions.RayError as error:
            raise JobFailed(f"job {job!r} was lost after {self.max_retries} retries: {error}") from error

    def close(self):
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.actors, self.idle = [], []
        self.running.clear()
