"""Where built data sets and cached features live."""

import os
from pathlib import Path

CACHE_ENV_VAR = "PML_FIELDLOSSES_CACHE"


def cache_dir(override=None):
    """The cache root: ``override`` if given, else $PML_FIELDLOSSES_CACHE, else
    the user cache directory (e.g. ~/.cache/pml-fieldlosses on Linux)."""
    if override is None:
        override = os.environ.get(CACHE_ENV_VAR) or None
    if override is None:
        import platformdirs

        override = platformdirs.user_cache_dir("pml-fieldlosses", appauthor=False)
    path = Path(override).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path
