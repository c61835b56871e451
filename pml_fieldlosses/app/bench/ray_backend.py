"""The bench's runs as Ray tasks: a drop-in for ``scheduler.run_jobs``.

``run_all(..., backend=ray_backend(address, device))`` sends every (loss, seed) run to
a Ray cluster (or a local Ray instance) instead of the local process pool: one GPU per run
with ``device="cuda"`` (Ray sets each task's CUDA_VISIBLE_DEVICES, so on one machine with N
GPUs N runs go side by side), one CPU per run otherwise. The runs write into the report
folder exactly as local runs do, so that folder must be on storage every node sees (it is
checked before the first run); resume and results are those of the local scheduler. The
runs' progress (epoch, validation MAP@R) comes back through a Ray queue.
"""

import functools

from .. import cluster


def _call(call):
    """In a Ray worker: one job of ``scheduler.run_jobs``'s kind, with progress sent back."""
    import ray

    function, shared_ref, job, progress = call

    def report(**info):
        progress.put((job, info))

    return function(ray.get(shared_ref), job, report)


def ray_backend(address=None, device="cpu", num_cpus=None, num_gpus=None):
    """A function with ``scheduler.run_jobs``'s signature that runs the jobs on Ray."""
    return functools.partial(_run_jobs, address, cluster.resources(device, num_cpus, num_gpus))


def _run_jobs(address, options, function, shared, jobs, workers, on_event=None, keep_results=True, cost=None):
    # ``cost`` (the local pool's order) is not used: every job is submitted at once
    from ray.util.queue import Empty, Queue

    on_event = on_event or (lambda kind, job, value: None)
    ray = cluster.connect(address)
    cluster.check_shared_folder(ray, str(shared.out_dir))
    jobs = [tuple(job) for job in jobs]
    progress = Queue()
    shared_ref = ray.put(shared)

    def drain():
        while True:
            try:
                job, info = progress.get_nowait()
            except Empty:
                return
            on_event("progress", tuple(job), info)

    results = {}
    calls = [(function, shared_ref, job, progress) for job in jobs]
    try:
        # Ray, not ``workers``, decides how many run at once: as many as the cluster's resources allow
        for call, result in cluster.as_completed(ray, _call, calls, options, poll=drain):
            job = call[2]
            drain()
            on_event("done", job, result)
            results[job] = result if keep_results else None
    finally:
        progress.shutdown()
    return [results[job] for job in jobs]
