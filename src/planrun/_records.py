"""Frozen records built at the speed of plain objects."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


class _Factory:
    """The default of a field with a default factory, as a dataclass's signature shows it."""

    def __repr__(self) -> str:
        return "<factory>"


def fast_init(cls: type[T]) -> type[T]:
    """Give a frozen dataclass an ``__init__`` with the same signature and defaults that
    fills the instance's own ``__dict__`` key by key (it keeps sharing its keys with
    the other instances': a new dict set in its place would take more memory).

    The frozen dataclass's own ``__init__`` sets each field through ``object.__setattr__``,
    about twice as slow; the records built once per task (a task, its report) use this.
    Only for classes with no ``__post_init__`` and no ``__slots__``.
    """
    if hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__:
        raise TypeError(f"fast_init: {cls.__name__} has __post_init__ or __slots__")
    params: list[str] = []
    lines: list[str] = []
    env: dict[str, Any] = {"_MISSING": _Factory()}
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    for f in fields:
        if f.default is not dataclasses.MISSING:
            env[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
            value = f.name
        elif f.default_factory is not dataclasses.MISSING:
            env[f"_f_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_MISSING")
            value = f"_f_{f.name}() if {f.name} is _MISSING else {f.name}"
        else:
            params.append(f.name)
            value = f.name
        lines.append(f"    state[{f.name!r}] = {value}\n")
    # One store per field, in the fields' order, into the instance's own dict: it keeps
    # sharing its keys with the other instances' (a dict built apart and set in its place,
    # or an update from a literal into the empty dict, would be a dict of its own, twice
    # the memory), and is faster than building a literal to update from.
    source = (f"def __init__(self, {', '.join(params)}):\n"
              f"    state = self.__dict__\n" + "".join(lines))
    exec(source, env)  # built from the dataclass's own field names
    init = env["__init__"]
    init.__qualname__ = f"{cls.__name__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = {**{f.name: f.type for f in fields}, "return": None}
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
