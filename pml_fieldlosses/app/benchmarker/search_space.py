"""The search space of pb's Bayesian optimisation: ``key~BAYESIAN~: [low, high]`` ranges
in the configs (``~LOG_BAYESIAN~``: log scale, ``~INT_BAYESIAN~``: integers) as ax
parameters, and a trial's values put back into the configs."""

import math

import numpy as np
from ax.api.configs import RangeParameterConfig

# keyword -> (ax parameter type, scaling)
SEARCH_KEYWORDS = {
    "~BAYESIAN~": ("float", "linear"),
    "~LOG_BAYESIAN~": ("float", "log"),
    "~INT_BAYESIAN~": ("int", "linear"),
}


def take_search_space(config, path=()):
    """The search parameters of a config dict (keys ending in a SEARCH_KEYWORDS entry,
    named by their path joined with '/'), removing the keyword from those keys in place,
    also inside ``dict_of_yamls`` (whose parameters are the same ones)."""
    parameters = []
    for key in list(config):
        value = config[key]
        if isinstance(value, dict):
            inner = take_search_space(value, path + (key,))
            if key != "dict_of_yamls" and "dict_of_yamls" not in path:
                parameters += inner
            continue
        for keyword, (parameter_type, scaling) in SEARCH_KEYWORDS.items():
            if key.endswith(keyword):
                name = key[: -len(keyword)]
                if not (isinstance(value, (list, tuple)) and len(value) == 2):
                    raise ValueError(f"{'/'.join(path + (key,))} must be a range [low, high], got {value!r}")
                cast = int if parameter_type == "int" else float
                bounds = (cast(value[0]), cast(value[1]))
                parameters.append(
                    RangeParameterConfig(
                        name="/".join(path + (name,)),
                        bounds=bounds,
                        parameter_type=parameter_type,
                        scaling=scaling,
                    )
                )
                config[name] = config.pop(key)
                break
    return parameters


def set_at_path(config, path, value):
    """Set config[a][b][c] = value for path 'a/b/c' if that path exists."""
    *parents, last = path.split("/")
    for key in parents:
        config = config.get(key)
        if not isinstance(config, dict):
            return
    if last in config:
        config[last] = value


def as_raw_data(metric, result):
    """pb's experiment result (mean, SEM) over folds, or the mean of a single fold, as ax data."""
    mean, sem = result if isinstance(result, tuple) else (result, None)
    if sem is None or not math.isfinite(float(sem)):
        return {metric: float(mean)}
    return {metric: (float(mean), float(sem))}


def plain(value):
    """numpy scalars as Python numbers (for YAML)."""
    return value.item() if isinstance(value, np.generic) else value
