"""Griffe extension: the docstrings' Sphinx roles as cross-references of the API page.

planrun's docstrings name other objects the way ``help()`` readers and Sphinx expect,
``:class:`~planrun.Plan```, ``:func:`plan_and_run```. mkdocstrings does not read roles,
so this extension (``extensions`` in ``mkdocs.yml``) rewrites each, when the site is built,
into a cross-reference to where the API page (``docs/reference/api.md``) renders the
object, ``[`Plan`][planrun.Plan]``, or into plain code when the page does not render it
(a private helper, a module documented elsewhere): never a raw role, never a dead link.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(?P<tilde>~?)"
    r"(?P<text>[^`<]+?)(?:\s*<(?P<target>[^>`]+)>)?`")
"""A Sphinx role: ``:class:`Name```, ``:func:`~a.b.c```, ``:meth:`text <a.b>```."""

PAGE = Path(__file__).resolve().parents[1] / "reference" / "api.md"
RENDERED = re.compile(r"^::: ([\w.]+)\s*$", re.M)


def rendered_identifiers(page: Path = PAGE) -> list[str]:
    """The objects the API page renders (its ``::: identifier`` lines)."""
    return RENDERED.findall(page.read_text(encoding="utf-8"))


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring of the package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Map each rendered object (and its public members) by its canonical path, then
        rewrite the roles of every docstring."""
        targets: dict[str, str] = {}
        for identifier in rendered_identifiers():
            try:
                obj = pkg.modules_collection[identifier]
            except (KeyError, griffe.AliasResolutionError):
                continue
            final = obj.final_target if obj.is_alias else obj
            targets[final.path] = identifier
            for name, member in final.members.items():
                if not name.startswith("_") and member.docstring is not None:
                    path = member.final_target.path if member.is_alias else member.path
                    targets.setdefault(path, f"{identifier}.{name}")
        for obj in _walk(pkg, set()):
            if obj.docstring is not None and ":" in obj.docstring.value:
                obj.docstring.value = ROLE.sub(lambda m, o=obj: _reference(m, o, targets),
                                               obj.docstring.value)


def _walk(obj: griffe.Object, seen: set[str]) -> list[griffe.Object]:
    if obj.path in seen:
        return []
    seen.add(obj.path)
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found += _walk(member, seen)  # type: ignore[arg-type]
    return found


def _reference(match: re.Match[str], obj: griffe.Object, targets: dict[str, str]) -> str:
    written = (match["target"] or match["text"]).strip().rstrip("()")
    label = match["text"].strip() if match["target"] else (
        written.rsplit(".", 1)[-1] if match["tilde"] else written)
    if match["text"].strip().endswith("()"):
        label += "()"
    path = _resolve(obj, written)
    where = targets.get(path or "") or (targets.get(path.rsplit(".", 1)[0]) if path else None)
    return f"[`{label}`][{where}]" if where else f"`{label}`"


def _resolve(obj: griffe.Object, name: str) -> str | None:
    """The canonical path ``name`` means in ``obj``'s scope, or None."""
    head, _, rest = name.partition(".")
    scope: griffe.Object | None = obj
    while scope is not None:
        try:
            found = scope.resolve(head)
            break
        except (griffe.NameResolutionError, KeyError, AttributeError):
            scope = scope.parent
    else:
        found = name if name.startswith("planrun") else None
    if found is None:
        return None
    full = f"{found}.{rest}" if rest and not found.endswith(rest) else found
    try:
        target = obj.modules_collection[full]
        return str(target.final_target.path if target.is_alias else target.path)
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return full
