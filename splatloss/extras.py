"""Optional dependency groups: one clear ImportError when a subpackage's extra is not installed."""

from __future__ import annotations

import importlib.util
import sys
from typing import List, Sequence


def missing(modules: Sequence[str]) -> List[str]:
    """The names in ``modules`` that cannot be imported here (absent, or blocked in ``sys.modules``)."""
    out = []
    for mod in modules:
        if mod in sys.modules:
            if sys.modules[mod] is None:
                out.append(mod)
        elif importlib.util.find_spec(mod) is None:
            out.append(mod)
    return out


def require_train_extra(package: str, modules: Sequence[str]) -> None:
    """Raise an ImportError naming ``pip install 'splatloss[train]'`` when any of ``modules`` is missing."""
    absent = missing(modules)
    if absent:
        raise ImportError(
            f"{package} needs the training dependencies; {', '.join(absent)} "
            "could not be imported. Install them with: pip install 'splatloss[train]'"
        )
