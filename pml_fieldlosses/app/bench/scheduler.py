"""The one process pool of the bench (runs and feature extraction).

``run_jobs(function, shared, jobs, workers, on_event)`` calls
``function(shared, job, report)`` for every job and returns the results in job
order. ``report(**info)`` sends progress from inside a job to ``on_event``; an
optional ``cost`` (job -> estimated seconds) lets the workers take the longest jobs
first.
Another backend (e.g. a cluster scheduler) replaces this one function.

With more than one worker, the workers are forked (``shared``, e.g. the
features, is inherited copy-on-write, never pickled), each takes one job at a
time from the parent (so nothing queued starts after an interrupt), dies with
its parent (PR_SET_PDEATHSIG on Linux, a parent-pid watchdog elsewhere), and
ignores Ctrl-C: the parent terminates the running jobs and keeps what finished.
"""

import ctypes
import ctypes.util
import functools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid):
    """Make this process end when ``parent_pid`` does."""
    libc_name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    if libc_name and ctypes.CDLL(libc_name, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0:
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
        return

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _worker(function, shared, parent_pid, conn):
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt stops
    while (job := conn.recv()) is not None:
        try:
            conn.send(("done", function(shared, job, functools.partial(_report, conn))))
        except BaseException as e:  # noqa: BLE001 (sent to the parent, which raises it)
            conn.send(("error", (_picklable(e), "".join(traceback.format_exception(e)))))


def _report(conn, **info):
    conn.send(("progress", info))


def _progress(on_event, job, **info):
    on_event("progress", job, info)


def _picklable(error):
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 (any pickling failure: send its text instead)
        return RuntimeError(f"{type(error).__name__}: {error}")


def _in_process(function, shared, jobs, on_event, keep):
    results = []
    for job in jobs:
        result = function(shared, job, functools.partial(_progress, on_event, job))
        on_event("done", job, result)
        results.append(result if keep else None)
    return results


def next_job(pending, cost):
    """The position in ``pending`` ([(index, job)]) of the job a free worker takes: the
    first, or with ``cost`` (job -> estimated seconds, None when not known yet) the first
    of unknown cost, else the costliest (longest first: the workers' last jobs are then
    the short ones, so they finish together)."""
    if cost is None:
        return 0
    costs = [cost(job) for _, job in pending]
    unknown = [i for i, c in enumerate(costs) if c is None]
    if unknown:
        return unknown[0]
    return max(range(len(costs)), key=lambda i: (costs[i], -i))


def run_jobs(function, shared, jobs, workers, on_event=None, keep_results=True, cost=None):
    """Results of ``function(shared, job, report)`` for each of ``jobs`` (in
    order), with ``workers`` processes (1: in this process). ``on_event(kind,
    job, value)`` is called in this process with kind "progress" (value: the
    info a job reported) and "done" (value: its result). A job's exception is
    raised here after the other running jobs are stopped. ``keep_results=False``:
    results are only given to ``on_event`` (e.g. written to a file), and None
    returned for each. ``cost``: the order in which the workers take the jobs
    (``next_job``); the results are in the order of ``jobs`` whatever it is."""
    on_event = on_event or (lambda kind, job, value: None)
    jobs = list(jobs)
    if workers <= 1 or len(jobs) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return _in_process(function, shared, jobs, on_event, keep_results)
    context = multiprocessing.get_context("fork")
    results, pending, busy, processes = {}, list(enumerate(jobs)), {}, {}
    try:
        for _ in range(min(workers, len(jobs))):
            conn, child = context.Pipe()
            processes[conn] = context.Process(target=_worker, args=(function, shared, os.getpid(), child))
            processes[conn].start()
            child.close()  # so that the parent sees EOF when this worker dies
            busy[conn] = pending.pop(next_job(pending, cost))
            conn.send(busy[conn][1])
        while busy:
            for conn in multiprocessing.connection.wait(list(busy)):
                index, job = busy[conn]
                try:
                    kind, value = conn.recv()
                except EOFError:
                    processes[conn].join()
                    raise RuntimeError(
                        f"the worker process running {job} died (exit code {processes[conn].exitcode}; "
                        "-9: killed, e.g. out of memory)"
                    ) from None
                if kind == "error":
                    raise value[0] from RuntimeError(f"in the worker running {job!r}:\n{value[1]}")
                if kind == "done":
                    results[index] = value if keep_results else None
                    del busy[conn]
                    if pending:
                        busy[conn] = pending.pop(next_job(pending, cost))
                        conn.send(busy[conn][1])
                    else:
                        conn.send(None)
                on_event(kind, job, value)
        for process in processes.values():
            process.join()
    finally:
        stop(list(processes.values()))
    return [results[i] for i in range(len(jobs))]


def stop(processes, grace=2.0):
    """Terminate the processes still running (SIGTERM, then SIGKILL after ``grace`` s)."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
