"""The report's figures (matplotlib, no display needed), each written whole or not at all
(errors.atomic_write)."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from pytorch_metric_learning.utils.inference import FaissKNN

from ..errors import atomic_write
from .result import UNTRAINED


def save(fig, path, **options):
    """Write ``fig`` as a PNG to ``path`` atomically and close it; a FileFault names the file
    when the file system refuses."""
    try:
        with atomic_write(path, "wb", doing="writing the figure") as f:
            fig.savefig(f, format="png", **options)
    finally:
        plt.close(fig)


def learning_curves(results, path):
    """Validation MAP@R per epoch, one panel per loss, one line per seed; the
    dashed line is the untrained model, the dots the selected (best) epochs."""
    untrained = [r["best_val_map_at_r"] for r in results if r["loss"] == UNTRAINED]
    names = list(dict.fromkeys(r["loss"] for r in results if r["loss"] != UNTRAINED))
    cols = min(4, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.7 * rows), squeeze=False, sharey=True)
    for ax, name in zip(axes.flat, names):
        for r in (r for r in results if r["loss"] == name):
            history = r["val_history"]
            (line,) = ax.plot(history["epoch"], history["map_at_r"], lw=1.2, label=f"seed {r['seed']}")
            if r["best_epoch"] in history["epoch"]:
                best = history["epoch"].index(r["best_epoch"])
                ax.plot(r["best_epoch"], history["map_at_r"][best], "o", color=line.get_color(), ms=4)
        if untrained:
            ax.axhline(np.mean(untrained), ls="--", color="gray", lw=1, label=UNTRAINED)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    for ax in axes[:, 0]:
        ax.set_ylabel("val MAP@R")
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    if names:
        axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    save(fig, path, dpi=110)


def time_per_epoch(results, path):
    """Mean training seconds per epoch of each loss (bars: min to max over seeds)."""
    names = list(dict.fromkeys(r["loss"] for r in results if r["loss"] != UNTRAINED))
    values = [[r["seconds_per_epoch"] for r in results if r["loss"] == n] for n in names]
    means = [np.mean(v) for v in values]
    low = [m - np.min(v) for m, v in zip(means, values)]
    high = [np.max(v) - m for m, v in zip(means, values)]
    fig, ax = plt.subplots(figsize=(6.5, 0.35 * len(names) + 1.2))
    ax.barh(names, means, xerr=[low, high], color="tab:blue", alpha=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("training seconds per epoch")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    save(fig, path, dpi=110)


def nearest(embeddings, queries, k):
    """Indices of the k nearest other test embeddings of each query (faiss)."""
    embeddings = torch.as_tensor(embeddings, dtype=torch.float32)
    # ref_includes_query drops each row's own index: the query set must be the reference set
    _, indices = FaissKNN()(embeddings, k, embeddings, ref_includes_query=True)
    return indices.cpu().numpy()[queries]


def retrieval_grid(images, labels, embeddings, path, num_queries=8, k=5, seed=0):
    """Random test queries (left, grey frame) and their top-k neighbours for each
    model in ``embeddings`` ({title: (N, D)}); green frame: same class as the
    query, red: another class. Drawn as one mosaic image."""
    rng = np.random.default_rng(seed)
    queries = np.sort(rng.choice(len(labels), size=min(num_queries, len(labels)), replace=False))
    neighbours = {title: nearest(e, queries, k) for title, e in embeddings.items()}
    size, frame, gap = images.shape[1], max(2, images.shape[1] // 16), max(4, images.shape[1] // 4)
    tile = size + 2 * frame
    colours = {"query": (128, 128, 128), True: (0, 160, 0), False: (220, 0, 0)}
    width = tile * (1 + k * len(embeddings)) + gap * len(embeddings)
    canvas = np.full((tile * len(queries), width, 3), 255, dtype=np.uint8)
    for row, q in enumerate(queries):
        cells = [(0, q, colours["query"])]
        for m, title in enumerate(embeddings):
            left = tile * (1 + m * k) + gap * (m + 1)
            cells += [
                (left + j * tile, n, colours[labels[n] == labels[q]])
                for j, n in enumerate(neighbours[title][row])
            ]
        for left, index, colour in cells:
            top = row * tile
            canvas[top : top + tile, left : left + tile] = colour
            canvas[top + frame : top + frame + size, left + frame : left + frame + size] = images[index]
    fig, ax = plt.subplots(figsize=(width / 55, canvas.shape[0] / 55 + 0.4))
    ax.imshow(canvas, interpolation="nearest")
    ax.set_xticks(
        [tile / 2] + [tile * (1 + m * k) + gap * (m + 1) + tile * k / 2 for m in range(len(embeddings))]
    )
    ax.set_xticklabels(["query"] + [f"{title}: top {k}" for title in embeddings], fontsize=9)
    ax.xaxis.tick_top()
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)
    fig.tight_layout(pad=0.2)
    save(fig, path, dpi=100)


def embedding_map(labels, embeddings, path, num_classes=20, seed=0):
    """t-SNE of the test embeddings of ``num_classes`` random test classes, one
    panel per model in ``embeddings``; colour = class."""
    from sklearn.manifold import TSNE

    rng = np.random.default_rng(seed)
    classes = rng.choice(np.unique(labels), size=min(num_classes, len(np.unique(labels))), replace=False)
    mask = np.isin(labels, classes)
    colour = np.searchsorted(np.sort(classes), labels[mask])
    fig, axes = plt.subplots(1, len(embeddings), figsize=(4.2 * len(embeddings), 4.2), squeeze=False)
    for ax, (title, e) in zip(axes[0], embeddings.items()):
        points = np.asarray(e, dtype=np.float32)[mask]
        if not np.isfinite(points).all() or np.ptp(points, axis=0).max(initial=0) == 0:
            plt.close(fig)
            raise ValueError(
                f"the test embeddings of {title} are all one point (or not finite): t-SNE cannot place them"
            )
        perplexity = max(2.0, min(15.0, (len(points) - 1) / 3))
        tsne = TSNE(2, perplexity=perplexity, init="pca", method="exact", random_state=seed)
        xy = tsne.fit_transform(points)
        ax.scatter(xy[:, 0], xy[:, 1], c=colour, cmap="tab20", s=18, edgecolors="k", linewidths=0.3)
        ax.set_title(title, fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"t-SNE of the test embeddings ({len(classes)} test classes, colour = class)", fontsize=10)
    fig.tight_layout()
    save(fig, path, dpi=110)
