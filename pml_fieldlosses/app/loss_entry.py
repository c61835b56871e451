"""A loss of the catalog (``catalog.LossEntry``): its class, its tuned
hyperparameter with its candidates, and how it is built; and the default
embedder. The table of entries and the loss names are in ``catalog``."""

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Callable, Optional

import torch


def format_number(value):
    """``value`` as a loss name writes it: an integer as one, a float by ``:g``
    when that reads back exactly (0.2, 1e-05), else in full."""
    if isinstance(value, int):
        return str(value)
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


def linear_embedder(in_features, embedding_size):
    """The default embedder, ``Linear(in_features, embedding_size)``, initialised
    like the embedding layers of the official ProxyAnchor, mean-field and DRML
    code (kaiming-normal, mode fan_out; bias 0), i.e. at the scale of the DRML
    head's layers: with Adam and normalised embeddings the effective step size
    is lr / weight scale, so every embedder must start at the same scale."""
    layer = torch.nn.Linear(in_features, embedding_size)
    torch.nn.init.kaiming_normal_(layer.weight, mode="fan_out")
    torch.nn.init.zeros_(layer.bias)
    return layer


@dataclass(frozen=True)
class LossEntry:
    name: str
    origin: str  # "PML" or "ours"
    loss_class: type
    # the tuned hyperparameter and its candidates (the first is the published default)
    tuned: str
    grid: tuple
    value: float = None
    # () -> miner, or None
    miner: Optional[Callable] = None
    # whether loss_class takes (num_classes, embedding_size) (proxies, class weights, mean fields)
    per_class: bool = True
    # (num_classes, embedding_size, **options) -> loss, for a loss built otherwise
    make: Optional[Callable] = None
    # (in_features, embedding_size) -> embedder module, or None for linear_embedder
    embedder: Optional[Callable] = None
    # ((keyword, value), ...) set by the name, e.g. PFML[alpha=2] (get_entry)
    options: tuple = ()

    @classmethod
    def declared(cls, declaration):
        """The entry of one of our losses, from its declaration (pml_fieldlosses.losses.declarations)."""
        return cls(
            declaration.bench_name,
            "ours",
            declaration.loss_class,
            declaration.tuned,
            declaration.grid,
            per_class=declaration.per_class,
            make=declaration.make,
            embedder=declaration.embedder,
        )

    def build(self, num_classes, embedding_size, **options):
        """The loss with the entry's value of its tuned hyperparameter and its
        ``options`` (the arguments win)."""
        options = {self.tuned: self.value, **dict(self.options), **options}
        if self.make is not None:
            return self.make(num_classes, embedding_size, **options)
        if self.per_class:
            return self.loss_class(num_classes, embedding_size, **options)
        return self.loss_class(**options)

    def make_embedder(self, in_features, embedding_size):
        return (self.embedder or linear_embedder)(in_features, embedding_size)

    @property
    def default(self):
        return self.grid[0]

    @property
    def short_name(self):
        """The loss class's name without "Loss", e.g. PotentialField."""
        return self.loss_class.__name__.removesuffix("Loss")

    def with_value(self, value):
        return dataclasses.replace(self, value=value)

    @property
    def base_name(self):
        """The name without its settings, e.g. PFML for PFML[alpha=2]."""
        return self.name.split("[", 1)[0]

    def variant(self, value):
        """The name of this loss with its tuned hyperparameter set to ``value`` and its
        other settings kept, e.g. PFML[delta=0.1], or PFML[alpha=2,delta=0.1] for the
        entry of PFML[alpha=2] (one bracket, which ``catalog.get_entry`` reads back)."""
        settings = [*self.options, (self.tuned, value)]
        return f"{self.base_name}[" + ",".join(f"{k}={format_number(v)}" for k, v in settings) + "]"

    def candidates(self):
        return [self.variant(v) for v in self.grid]

    def keywords(self):
        """The keywords a name may set: the tuned one and those the loss's
        constructor (or ``make``) names, but not the sizes."""
        if self.make is not None:
            function, skip = self.make, 2  # make(C, D, ...)
        else:
            function, skip = self.loss_class.__init__, 3 if self.per_class else 1  # self, C, D
        parameters = list(inspect.signature(function).parameters.values())[skip:]
        named = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        return [self.tuned] + [k for k in named if k != self.tuned]
