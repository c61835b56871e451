"""The trained state of a potential-field loss from a real bench run, stored as
test data: the proxies of the run's best epoch and real training embeddings
through that epoch's embedder. tests/test_potential_real_state.py replays
training steps from it (real proxies contract until most of their
pairs lie just outside the repulsion radius).

    python -c "from pml_fieldlosses.app.datasets import write_glyph_folder; write_glyph_folder('GLYPHS')"
    pml-fieldlosses bench --data GLYPHS --losses ProxyAnchor,PFML,CPML --seeds 1 --out RUNS
    python scripts/make_contracted_state.py --data GLYPHS \\
        --run RUNS/folder-GLYPHS-efficientnet-lite0-64px-<hash>/runs/PFML/seed0 \\
        --out tests/data/glyph_pfml_state.npz

The run's bench folder must hold the default protocol (``protocol.json`` is
checked against it); the features come from the bench's cache (computed if
missing). Stored (the test's inputs, not its expected values): the raw
proxies (num_classes, proxies_per_class, D; float32: their norm sets the
optimiser's step on the sphere), ``--samples`` normalised embeddings of
training images (their clean view; float16) drawn with ``--seed``, their
labels, and a JSON record of where they come from.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from pml_fieldlosses.app import catalog
from pml_fieldlosses.app.bench.pipeline import prepare
from pml_fieldlosses.app.bench.protocol import BenchConfig


def best_model(models, part):
    """The state dict of ``part`` (embedder, metric_loss) at the run's best epoch."""
    (path,) = sorted(Path(models).glob(f"{part}_best*.pth"))
    return path, torch.load(path, map_location="cpu", weights_only=True)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", required=True, help="the bench run's --data (an image folder or a built-in set)"
    )
    parser.add_argument("--run", required=True, help="the run's seed folder, e.g. .../runs/PFML/seed0")
    parser.add_argument("--out", required=True, help="the .npz to write")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    run = Path(args.run)
    loss_name, bench_folder = run.parent.name, run.parents[2]
    config = BenchConfig(data=args.data, losses=(loss_name,))
    _, split, inputs, _ = prepare(config, bench_folder, sys.stdout)
    embedder_path, embedder_state = best_model(run / "models", "embedder")
    loss_path, loss_state = best_model(run / "models", "metric_loss")
    embedder = catalog.get_entry(loss_name).make_embedder(inputs.in_features, config.embedding_size)
    embedder.load_state_dict(embedder_state)
    trunk = inputs.make_trunk()
    generator = np.random.default_rng(args.seed)
    chosen = np.sort(
        generator.choice(len(split.train), size=min(args.samples, len(split.train)), replace=False)
    )
    features = torch.from_numpy(np.asarray(inputs.eval_inputs[split.train[chosen]])).float()
    with torch.no_grad():
        embeddings = torch.nn.functional.normalize(embedder(trunk(features)), dim=1)
    proxies = loss_state["proxies"].float()
    record = {
        "data": str(args.data),
        "loss": loss_name,
        "embedder": str(embedder_path),
        "proxies": str(loss_path),
        "samples": len(chosen),
        "seed": args.seed,
        "protocol": config.protocol(),
    }
    np.savez_compressed(
        args.out,
        proxies=proxies.numpy(),
        embeddings=embeddings.numpy().astype(np.float16),
        labels=split.train_labels[chosen].astype(np.int64),
        record=json.dumps(record),
    )
    flat = torch.nn.functional.normalize(proxies.reshape(-1, proxies.shape[-1]), dim=1)
    print(
        f"{args.out}: proxies {tuple(proxies.shape)}, median pairwise distance "
        f"{torch.pdist(flat).median():.3f}; {len(chosen)} embeddings of "
        f"{len(np.unique(split.train_labels[chosen]))} classes"
    )


if __name__ == "__main__":
    main()
