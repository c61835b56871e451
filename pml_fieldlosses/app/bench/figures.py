"""Which figures the bench's report has (plots.py draws them): the learning curves and
the time per epoch of every run, and for the best loss's seed-0 test embeddings the
retrieval grid and the 2-D map, both against the untrained model.

The figures are an extra: the table and summary are written before them, and a figure
that cannot be drawn (a t-SNE of test embeddings that are all one point, embeddings that
are not finite) is skipped with a one-line warning naming it and why, which the report
repeats. A file-system fault (a full disk) is not skipped: it stops the command, named."""

from ..errors import FileFault
from .baseline import untrained_test_embeddings
from .metrics import PRIMARY
from .result import UNTRAINED, BenchFileError, read_embeddings, run_folder

__all__ = ["make_plots", "read_embeddings"]

RETRIEVAL = "retrieval_grid.png"
MAP = "embedding_map.png"


class Figures:
    """The figures drawn ([(title, file name)]) and skipped ([(file name, why)])."""

    def __init__(self, out_dir, file):
        self.out_dir, self.file = out_dir, file
        self.made, self.skipped = [], []

    def skip(self, name, why):
        print(f"warning: figure {name} skipped: {why}", file=self.file)
        self.skipped.append((name, why))

    def draw(self, title, name, function, *args):
        """``function(*args, path)``; a failure other than the file system's skips the figure."""
        from . import plots  # matplotlib (and its Agg backend) only when there is something to draw

        try:
            function(*args, self.out_dir / name)
        except (FileFault, OSError):
            raise
        except Exception as e:  # noqa: BLE001 (any failure of a figure: the report goes on without it)
            plots.plt.close("all")
            self.skip(name, one_line(e))
            return
        self.made.append((title, name))


def one_line(error):
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def make_plots(results, rows, dataset, inputs, config, out_dir, file=None):
    """Draw the figures; returns a Figures (made and skipped)."""
    from . import plots

    figures = Figures(out_dir, file)
    figures.draw("Learning curves (validation MAP@R)", "learning_curves.png", plots.learning_curves, results)
    figures.draw("Training time per epoch", "time_per_epoch.png", plots.time_per_epoch, results)
    trained = [r for r in rows if r["loss"] != UNTRAINED]
    if not trained:
        return figures
    best = trained[0]["loss"]
    path = run_folder(out_dir, best, 0) / "test_embeddings.npz"
    try:
        saved = read_embeddings(path, len(inputs.split.test), inputs.split.test_labels)
    except BenchFileError as e:
        for name in (RETRIEVAL, MAP):
            figures.skip(name, str(e))
        return figures
    if saved is None:
        for name in (RETRIEVAL, MAP):
            figures.skip(name, f"{path} is missing")
        return figures
    try:
        untrained = untrained_test_embeddings(inputs, config)[0]
    except Exception as e:  # noqa: BLE001 (the untrained model's embeddings only serve the figures)
        for name in (RETRIEVAL, MAP):
            figures.skip(name, f"the untrained model's test embeddings: {one_line(e)}")
        return figures
    embeddings = {UNTRAINED: untrained, best: saved[0]}
    labels = saved[1]
    images = dataset.images[inputs.split.test]
    title = f"Retrieval: {UNTRAINED} vs {best} (best {PRIMARY}), seed 0"
    figures.draw(title, RETRIEVAL, plots.retrieval_grid, images, labels, embeddings)
    figures.draw("2-D map of test embeddings", MAP, plots.embedding_map, labels, embeddings)
    return figures
