"""Which figures the bench's report has (plots.py draws them): the learning curves and
the time per epoch of every run, and for the best loss's seed-0 test embeddings the
retrieval grid and the 2-D map, both against the untrained model."""

import zipfile

import numpy as np

from .baseline import untrained_test_embeddings
from .metrics import PRIMARY
from .result import UNTRAINED, BenchFileError, run_folder


def make_plots(results, rows, dataset, inputs, config, out_dir, file=None):
    """Draw the figures; returns [(title, file name)] of those made."""
    from . import plots  # matplotlib (and its Agg backend) only when there is something to draw

    made = []
    plots.learning_curves(results, out_dir / "learning_curves.png")
    made.append(("Learning curves (validation MAP@R)", "learning_curves.png"))
    plots.time_per_epoch(results, out_dir / "time_per_epoch.png")
    made.append(("Training time per epoch", "time_per_epoch.png"))
    trained = [r for r in rows if r["loss"] != UNTRAINED]
    if not trained:
        return made
    best = trained[0]["loss"]
    path = run_folder(out_dir, best, 0) / "test_embeddings.npz"
    try:
        saved = read_embeddings(path, len(inputs.split.test))
    except BenchFileError as e:
        print(f"warning: {e}; the report has no retrieval figures", file=file)
        return made
    if saved is not None:
        embeddings = {UNTRAINED: untrained_test_embeddings(inputs, config)[0], best: saved[0]}
        labels = saved[1]
        images = dataset.images[inputs.split.test]
        plots.retrieval_grid(images, labels, embeddings, out_dir / "retrieval_grid.png")
        made.append((f"Retrieval: {UNTRAINED} vs {best} (best {PRIMARY}), seed 0", "retrieval_grid.png"))
        plots.embedding_map(labels, embeddings, out_dir / "embedding_map.png")
        made.append(("2-D map of test embeddings", "embedding_map.png"))
    return made


def read_embeddings(path, rows):
    """(float32 embeddings, labels) saved in ``path`` for ``rows`` test images,
    None if there is no such file; BenchFileError naming a bad one."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            embeddings, labels = saved["embeddings"].astype(np.float32), saved["labels"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise BenchFileError(f"{path} is not a saved embedding file ({e!r})") from None
    if embeddings.ndim != 2 or embeddings.shape[0] != rows or labels.shape != (rows,):
        raise BenchFileError(
            f"{path} holds embeddings {embeddings.shape} and labels {labels.shape}, expected {rows} rows"
        )
    return embeddings, labels
