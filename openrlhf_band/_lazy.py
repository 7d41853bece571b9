"""One helper for the packages that import their public names on first use (PEP 562): `openrlhf_band`,
`openrlhf_band.ops` and `openrlhf_band.integration`, so that importing one name never imports what another needs
(Triton, OpenRLHF, einops). It imports nothing of the package: every layer may use it."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_names(package: str, public: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """(`__getattr__`, `__dir__`) for `package`: `public` maps each name to the module that defines it; a name is
    imported on first access and then kept in the package's namespace."""

    def __getattr__(name: str):
        if name not in public:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(public[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted([*vars(sys.modules[package]), *public])

    return __getattr__, __dir__
