"""The search space of pb's Bayesian optimisation: ``key~BAYESIAN~: [low, high]`` ranges
in the configs (``~LOG_BAYESIAN~``: log scale, ``~INT_BAYESIAN~``: integers) as ax
parameters, and a trial's values put back into the configs."""

import math

import numpy as np
from ax.api.configs import RangeParameterConfig

from ..errors import UsageError

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
                bounds = search_range(value, "/".join(path + (key,)), parameter_type, scaling)
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


def as_number(value):
    """A number of a range: an int or float, or a string float() reads ('1e-6', which YAML
    reads as a string); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    try:
        return float(value) if isinstance(value, str) else None
    except ValueError:
        return None


def search_range(value, where, parameter_type, scaling):
    """``(low, high)`` of a search range ``value`` ([low, high] of numbers, low < high;
    integers for ``~INT_BAYESIAN~``; low > 0 on a log scale); a UsageError naming ``where``
    otherwise."""
    bounds = [as_number(v) for v in value] if isinstance(value, (list, tuple)) and len(value) == 2 else []
    numbers = len(bounds) == 2 and None not in bounds and all(math.isfinite(b) for b in bounds)
    if numbers and (parameter_type != "int" or all(float(b).is_integer() for b in bounds)):
        cast = int if parameter_type == "int" else float
        low, high = cast(bounds[0]), cast(bounds[1])
        if low < high and (scaling != "log" or low > 0):
            return low, high
    kind = "integers" if parameter_type == "int" else "numbers"
    log = " and low > 0 (log scale)" if scaling == "log" else ""
    raise UsageError(
        f"{where}: expected a search range [low, high] of {kind} with low < high{log}, got {value!r}"
    )


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
