"""A small class-structured dataset for trainer tests: the class signal lives
in a few directions of a nonlinear feature map, buried in nuisance noise, so
an untrained network retrieves poorly and a trained one well."""

import torch
from pytorch_metric_learning import testers
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator


def make_toy_datasets(num_classes=16, train_per_class=24, test_per_class=12, in_dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(num_classes, 4, generator=g) * 1.5
    mixing = torch.randn(4, in_dim, generator=g)

    def sample(per_class):
        labels = torch.arange(num_classes).repeat_interleave(per_class)
        latent = centers[labels] + 0.35 * torch.randn(len(labels), 4, generator=g)
        signal = torch.tanh(latent @ mixing)
        noise = 0.8 * torch.randn(len(labels), in_dim, generator=g)
        return torch.utils.data.TensorDataset(signal + noise, labels)

    return sample(train_per_class), sample(test_per_class)


def make_models(in_dim=32, embedding_size=16, seed=0):
    torch.manual_seed(seed)
    trunk = torch.nn.Sequential(torch.nn.Linear(in_dim, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    embedder = torch.nn.Linear(64, embedding_size)
    return trunk, embedder


def make_tester(**kwargs):
    """PML's GlobalEmbeddingSpaceTester computing MAP@R on the CPU."""
    return testers.GlobalEmbeddingSpaceTester(
        dataloader_num_workers=0,
        data_device=torch.device("cpu"),
        accuracy_calculator=AccuracyCalculator(k="max_bin_count", include=("mean_average_precision_at_r",)),
        **kwargs,
    )
