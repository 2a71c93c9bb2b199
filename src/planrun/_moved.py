"""Old module paths, kept working for one release with a :class:`DeprecationWarning`.

planrun's modules live in packages by role (:mod:`planrun.core`, :mod:`planrun.runtime`,
:mod:`planrun.model`, :mod:`planrun.obs`, :mod:`planrun.dev`, :mod:`planrun.cli._main`). Importing
one of the flat paths below still works: the import warns once and hands back the module at
its new place, so ``planrun.supervisor.Supervisor is planrun.Supervisor``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "install"]

MOVED: dict[str, str] = {
    "planrun.approval": "planrun.runtime._decisions",
    "planrun.attempt": "planrun.runtime._attempt",
    "planrun.clock": "planrun.runtime._clock",
    "planrun.compare": "planrun.dev.compare",
    "planrun.console": "planrun.obs._console",
    "planrun.decompose": "planrun.model._decompose",
    "planrun.demo": "planrun.dev.demo",
    "planrun.distributed": "planrun.runtime._deprecated",
    "planrun.errors": "planrun.core._errors",
    "planrun.eval": "planrun.dev.eval",
    "planrun.fixtures": "planrun.dev.fixtures",
    "planrun.ledger": "planrun.core._ledger",
    "planrun.limiter": "planrun.model._limiter",
    "planrun.limits": "planrun.model._limits",
    "planrun.ownership": "planrun.runtime._ownership",
    "planrun.plan": "planrun.core._plan",
    "planrun.prompts": "planrun.model._prompts",
    "planrun.pytest_plugin": "planrun.dev.pytest_plugin",
    "planrun.redact": "planrun.core._redact",
    "planrun.registry": "planrun.core._registry",
    "planrun.routing": "planrun.core._routing",
    "planrun.runner": "planrun._facade",
    "planrun.scenarios": "planrun.dev.scenarios",
    "planrun.scheduling": "planrun.core.scheduling",
    "planrun.sim": "planrun.dev.sim",
    "planrun.status": "planrun.obs._status",
    "planrun.supervisor": "planrun.runtime._supervisor",
    "planrun.task": "planrun.core._task",
    "planrun.taskbench": "planrun.dev.taskbench",
    "planrun.tracing": "planrun.obs.tracing",
    "planrun.usage": "planrun.model._usage",
    "planrun.workers": "planrun.model._workers",
}
"""Old dotted path -> the module that now holds its code."""


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new place."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} is deprecated and will be removed in the next release; "
            f"import from planrun (or {self.target}) instead",
            DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.target)
        sys.modules[spec.name] = module
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The target module is already executed."""


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED` (and nothing else)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


class _Package(ModuleType):
    """The ``planrun`` package, whose public names an old module path cannot shadow.

    Importing a submodule sets it as an attribute of its package: ``import planrun.decompose``
    (an old path) would replace the function ``planrun.decompose`` with the module."""

    def __setattr__(self, name: str, value: object) -> None:
        current = self.__dict__.get(name)
        if (isinstance(value, ModuleType) and f"{self.__name__}.{name}" in MOVED
                and current is not None and not isinstance(current, ModuleType)):
            return
        super().__setattr__(name, value)


def install() -> None:
    """Put the finder on :data:`sys.meta_path` (once); keep the package's public names."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
    package = sys.modules.get("planrun")
    if package is not None and type(package) is ModuleType:
        package.__class__ = _Package
