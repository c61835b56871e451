import faulthandler
import sys
import threading

import pytest
import torch


@pytest.fixture(autouse=True)
def same_global_random_state():
    """Every test starts from the same global torch random state, whatever ran before it: a
    loss's initial proxies or a test module's weights come from it, and a test whose outcome
    depended on them would otherwise pass or fail with the tests run before it (their order
    and number, a parametrisation)."""
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def local_ray():
    """A local Ray instance with 2 CPUs, started once for every test of the session that needs
    one and shut down at the session's end. Ray supports one driver per process: the native
    threads of a driver (its gRPC and io-service threads) keep running after ray.shutdown(), and
    a second ray.init in the same process can crash it, then or at its exit. No test starts or
    stops Ray by itself (no_thread_left_behind checks it)."""
    ray = pytest.importorskip("ray")
    from pml_fieldlosses.app import cluster

    yield cluster.connect(num_cpus=2)
    ray.shutdown()


def ray_initialized():
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def is_background_thread(thread):
    """A thread that lives on by design: tqdm's progress-bar monitor (one per process), and
    the Python threads of the session's Ray driver (local_ray: no test starts Ray otherwise)."""
    return type(thread).__name__ == "TMonitor" or (thread.name == "PythonGCThread" and ray_initialized())


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    """A test ends with the threads it started ended (a TensorBoard writer or a worker pool
    left open keeps its thread running to the interpreter's exit), and with Ray as it found it
    (local_ray)."""
    before, ray_before = set(threading.enumerate()), ray_initialized()
    yield
    left = [
        t for t in threading.enumerate() if t not in before and t.is_alive() and not is_background_thread(t)
    ]
    assert not left, f"the test left threads running: {[(t.name, type(t).__name__) for t in left]}"
    assert ray_initialized() == ray_before, "the test started or shut down Ray itself: use local_ray"


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """A crash while the interpreter shuts down (a native library's threads or destructors) prints
    the stacks of every thread instead of a bare exit code: pytest's own fault handler is off by
    now."""
    faulthandler.enable(file=sys.__stderr__, all_threads=True)
