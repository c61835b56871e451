"""The class names in pb's configs, looked up as pb does, with a name it cannot find
reported as one line naming the kind, the name and where it is set.

pb's lookup (easy_module_attribute_getter's ``get``) raises a bare ``AttributeError`` for
a name found in no registered module (a traceback without the name). ``find_class`` looks
a name up in the same modules; ``NamedGetter`` is pb's lookup with that error named
(``UnknownClass``); ``check_config_classes`` checks every class slot of a loaded config
before anything runs (the launcher's checks, checks.py).
"""

import difflib
import inspect

from easy_module_attribute_getter import PytorchGetter

from ..errors import UsageError

# config key -> the kind of the one class it names ({ClassName: params})
ONE_CLASS = {
    "dataset": "dataset",
    "split_manager": "split_manager",
    "sampler": "sampler",
    "trainer": "trainer",
    "tester": "tester",
    "aggregator": "aggregator",
    "ensemble": "ensemble",
    "hook_container": "hook_container",
    "api_parser": "api_parser",
}
# config key -> the kind of the class of each of its entries ({name: {ClassName: params}})
NAMED_CLASSES = {
    "models": "model",
    "loss_funcs": "loss",
    "mining_funcs": "miner",
    "optimizers": "optimizer",
    "factories": "factory",
}
# parameters that name a class themselves: {parameter: kind}, for the losses and testers
# (pb's LossFactory and TesterFactory)
NESTED = {
    "loss": {
        "distance": "distance",
        "reducer": "reducer",
        "embedding_regularizer": "regularizer",
        "weight_regularizer": "regularizer",
        "weight_init_func": "weight_init_func",
    },
    "tester": {"accuracy_calculator": "accuracy_calculator", "visualizer": "visualizer"},
}
# the keys beside the class in an optimizer's spec: {key: kind} (pb's get_optimizer; None: a number)
OPTIMIZER_EXTRAS = {
    "scheduler_by_iteration": "lr_scheduler",
    "scheduler_by_epoch": "lr_scheduler",
    "scheduler_by_plateau": "lr_scheduler",
    "clip_grad_norm": None,
}
# parameters that a factory takes out of a spec before it builds the class: {kind: names}
# (compat.TesterFactory: reference_set)
CONSUMED = {"tester": {"reference_set"}}
# config key -> the kind of every key of its entries ({train: {Class: params, ...}, ...})
SEQUENCES = {"transforms": "transform"}


class UnknownClass(AttributeError):
    """A class name that no registered module has (an AttributeError, as pb's lookup
    raises, so that pb's own fallbacks still work; the launcher prints it in one line)."""


def find_class(getter, kind, name):
    """The class (or function) named ``name`` of ``kind`` in ``getter``'s modules, as pb's
    lookup finds it; None if there is none."""
    for module in getattr(getter, kind, []):
        if inspect.ismodule(module) and hasattr(module, name):
            return getattr(module, name)
        if inspect.isclass(module) and module.__name__ == name:
            return module
    return None


def unknown(kind, name, where):
    return UnknownClass(
        f"{where}: no {kind} named {name!r} (pml-fieldlosses', pb's, PML's and torch's are looked up by "
        f"name): check its spelling in the configs and the command line's overrides, or register yours "
        f"with --register {kind}=MODULE"
    )


def one_class(spec, kind, where):
    """The class name of ``spec`` ({ClassName: params}); a UsageError unless it is one."""
    if not (isinstance(spec, dict) and len(spec) == 1 and isinstance(next(iter(spec)), str)):
        raise UsageError(f"{where}: expected one {kind} as {{ClassName: {{params}}}}, got {spec!r}")
    return next(iter(spec))


class NamedGetter(PytorchGetter):
    """pb's lookup, raising ``UnknownClass`` (named) for a name no module has."""

    @classmethod
    def like(cls, getter):
        """A NamedGetter with ``getter``'s registered modules."""
        named = cls.__new__(cls)
        named.__dict__.update(vars(getter))
        return named

    def get(self, obj_name, class_name=None, params=None, yaml_dict=None, **kwargs):
        name = class_name
        if name is None and isinstance(yaml_dict, dict):
            name = one_class(yaml_dict, obj_name, f"the {obj_name} config")
        if isinstance(name, str) and find_class(self, obj_name, name) is None:
            raise unknown(obj_name, name, f"the {obj_name} config")
        return super().get(obj_name, class_name, params, yaml_dict, **kwargs)


def check_class(getter, kind, spec, where):
    """``spec`` ({ClassName: params}, or empty) names a class of ``kind``; its class-naming
    parameters (NESTED) too."""
    if spec is None or spec == {}:
        return
    if kind == "optimizer" and isinstance(spec, dict):
        spec = dict(spec)
        for key, extra_kind in OPTIMIZER_EXTRAS.items():
            extra = spec.pop(key, None)
            if extra_kind is not None and extra:
                check_class(getter, extra_kind, extra, f"{where}/{key}")
    name = one_class(spec, kind, where)
    found = find_class(getter, kind, name)
    if found is None:
        raise unknown(kind, name, where)
    params = spec[name]
    check_parameters(found, kind, params, f"{where}/{name}")
    for parameter, inner_kind in NESTED.get(kind, {}).items():
        if isinstance(params, dict) and params.get(parameter):
            check_class(getter, inner_kind, params[parameter], f"{where}/{name}/{parameter}")


def check_parameters(found, kind, params, where):
    """The parameters that a config gives class (or function) ``found`` are its own
    (unless it takes ``**kwargs``): a misspelt one would be a TypeError when the run
    builds it. A search range's key counts as its parameter (``alpha~BAYESIAN~``)."""
    if params is None:
        return
    if not isinstance(params, dict):
        raise UsageError(f"{where}: expected its parameters as a mapping {{name: value}}, got {params!r}")
    try:
        accepted = inspect.signature(found).parameters
    except (TypeError, ValueError):  # no signature to check against (a builtin)
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return
    for key in params:
        if str(key).split("~", 1)[0] not in accepted and key not in CONSUMED.get(kind, ()):
            close = difflib.get_close_matches(str(key), list(accepted), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UsageError(
                f"{where}: no parameter {key!r}{hint}; its parameters: {', '.join(accepted) or 'none'}"
            )


def check_config_classes(config, getter):
    """Every class that ``config`` (pb's merged configs, a dict) names exists in
    ``getter``'s modules: a UsageError naming the config key, the kind and the name otherwise."""
    for key, kind in ONE_CLASS.items():
        check_class(getter, kind, config.get(key), key)
    for key, kind in NAMED_CLASSES.items():
        entries = config.get(key) or {}
        if not isinstance(entries, dict):
            raise UsageError(f"{key}: expected {{name: {{ClassName: {{params}}}}}}, got {entries!r}")
        for entry, spec in entries.items():
            check_class(getter, kind, spec, f"{key}/{entry}")
    for key, kind in SEQUENCES.items():
        for entry, specs in (config.get(key) or {}).items():
            if not isinstance(specs or {}, dict):
                raise UsageError(f"{key}/{entry}: expected {{ClassName: {{params}}, ...}}, got {specs!r}")
            for name, params in (specs or {}).items():
                found = find_class(getter, kind, name)
                if found is None:
                    raise unknown(kind, name, f"{key}/{entry}")
                check_parameters(found, kind, params, f"{key}/{entry}/{name}")
