"""Where K long-lived workers fit on a Ray cluster. Each worker holds its CPUs and GPUs
on one node for its whole life, so K workers fit only if the nodes can hold them side by
side: sum over the nodes of floor(node's CPUs / CPUs per worker) >= K, and the same for
GPUs. A worker that does not fit would stay pending in Ray forever."""

import math


class SlotsDoNotFit(ValueError):
    """K workers with the requested resources cannot all be placed on the cluster."""


def alive_nodes(ray):
    """[(CPUs, GPUs)] of the cluster's live nodes."""
    return [
        (node["Resources"].get("CPU", 0), node["Resources"].get("GPU", 0))
        for node in ray.nodes()
        if node["Alive"]
    ]


def how_many_fit(nodes, cpus, gpus=0):
    """How many workers of ``cpus`` CPUs and ``gpus`` GPUs each the ``nodes`` hold side by side."""
    total = 0
    for node_cpus, node_gpus in nodes:
        on_node = math.floor(node_cpus / cpus + 1e-9) if cpus > 0 else math.inf
        if gpus > 0:
            on_node = min(on_node, math.floor(node_gpus / gpus + 1e-9))
        total += on_node
    return total


def check_fit(nodes, slots, cpus, gpus=0):
    """Raises SlotsDoNotFit, naming the request and the nodes, unless ``slots`` workers fit."""
    if how_many_fit(nodes, cpus, gpus) < slots:
        request = f"{cpus:g} CPU(s)" + (f" and {gpus:g} GPU(s)" if gpus else "")
        raise SlotsDoNotFit(
            f"{slots} parallel workers of {request} each do not fit on the Ray cluster's nodes "
            f"({', '.join(f'{c:g} CPUs/{g:g} GPUs' for c, g in nodes)}): at most "
            f"{how_many_fit(nodes, cpus, gpus)} do; ask for fewer workers or less per worker"
        )


def slot_cpus(nodes, slots, gpus=0):
    """The most CPUs per worker (at most the cluster's CPUs / ``slots``, rounded down to Ray's
    1e-4 granularity) with which ``slots`` workers of ``gpus`` GPUs each fit on ``nodes``."""
    if not nodes or max(c for c, _ in nodes) <= 0:
        raise SlotsDoNotFit("the Ray cluster has no CPUs")
    share = sum(c for c, _ in nodes) / slots
    candidates = {share} | {c / k for c, _ in nodes if c > 0 for k in range(1, slots + 1)}
    for cpus in sorted((c for c in candidates if c <= share), reverse=True):
        cpus = math.floor(cpus * 1e4) / 1e4
        if cpus > 0 and how_many_fit(nodes, cpus, gpus) >= slots:
            return cpus
    check_fit(nodes, slots, 1e-4, gpus)  # raises: not even the smallest share fits (GPUs)
    raise SlotsDoNotFit(f"{slots} parallel workers do not fit on the Ray cluster's nodes")
