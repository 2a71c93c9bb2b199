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
    builds the instance's state from a copy of one held by a prototype, every field at its
    default: the fields given something other than their default, and those with a default
    factory, are stored into it, and the state is set whole. The copy shares its keys with
    every other instance's (a dict of its own would take twice the memory).

    The frozen dataclass's own ``__init__`` sets each field through ``object.__setattr__``,
    some three times as slow; the records built once per task (a task, its report) use
    this. Only for classes with no ``__post_init__`` and no ``__slots__``.
    """
    if hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__:
        raise TypeError(f"fast_init: {cls.__name__} has __post_init__ or __slots__")
    params: list[str] = []
    lines: list[str] = []
    env: dict[str, Any] = {"_MISSING": _Factory(), "_set": object.__setattr__}
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    prototype = object.__new__(cls)
    proto_state = prototype.__dict__
    for f in fields:  # the prototype's keys in the fields' order: every copy shares them
        if f.default is not dataclasses.MISSING:
            env[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
            proto_state[f.name] = f.default
            lines.append(f"    if {f.name} is not _d_{f.name}:\n"
                         f"        state[{f.name!r}] = {f.name}\n")
        elif f.default_factory is not dataclasses.MISSING:
            env[f"_f_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_MISSING")
            proto_state[f.name] = None
            lines.append(f"    state[{f.name!r}] = _f_{f.name}() if {f.name} is _MISSING "
                         f"else {f.name}\n")
        else:
            params.append(f.name)
            proto_state[f.name] = None
            lines.append(f"    state[{f.name!r}] = {f.name}\n")
    env["_proto"] = proto_state
    source = (f"def __init__(self, {', '.join(params)}):\n"
              f"    state = _proto.copy()\n" + "".join(lines) +
              "    _set(self, '__dict__', state)\n")
    exec(source, env)  # built from the dataclass's own field names
    init = env["__init__"]
    init.__qualname__ = f"{cls.__name__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = {**{f.name: f.type for f in fields}, "return": None}
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
