"""TaskBench tool graphs and samples as planrun registries and plan documents.

TaskBench (Shen et al., arXiv:2311.18760) ships, per domain folder, a tool graph
(``tool_desc.json``: one node per tool) and samples (``data.json`` or the ``data_head.jsonl``
excerpt, one JSON object a line) whose ``task_nodes`` and ``task_links`` form a small DAG of
tool calls. RestBench-TMDB comes in the same format (``data.json``, nodes without
arguments).

    registry = load_tool_graph(folder)           # one kind per tool
    for sample_id, document in iter_plans(folder):
        plan = Plan.parse(document, registry)

What the conversion does with the data's quirks:

* Node identity is the tool name; links name tools. A link between two different tools
  joins every node of the one to every node of the other. A link from a tool to itself,
  where the tool occurs more than once, joins its occurrences in data order (RestBench-TMDB
  sample 78); where it occurs once it stays a self-dependency, which validation reports.
* ``task_nodes`` are not in topological order; they are put in one (ties in data order)
  and ``<node-k>`` references inside arguments are renumbered to the new positions.
  References that point outside the sample are left as they are. Where the links form a
  cycle, the data order is kept, and validation reports the dependencies that point forward.
* Dependencies come from ``task_links`` only: the ``<node-k>`` references are unreliable
  (self references, references out of range, references without a link).
* A node's ``arguments`` become ``payload["arguments"]`` verbatim (strings for HuggingFace
  and Multimedia, ``{"name", "value"}`` objects for DailyLifeAPIs); nodes without arguments
  get an empty payload; other node keys (a stray ``output``) are dropped.
"""

from __future__ import annotations

import graphlib
import itertools
import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from planrun.core import KindSpec, Registry, UsageError, smallest_order

__all__ = [
    "DATASETS",
    "iter_plans",
    "iter_samples",
    "load_tool_graph",
    "sample_to_plan",
    "tool_graph_links",
]

DATASETS: Final[tuple[str, ...]] = (
    "data_huggingface",
    "data_multimedia",
    "data_dailylifeapis",
    "restbench_tmdb",
)
"""The dataset folders of the TaskBench data shipped with the project."""

_SAMPLE_FILES: Final[tuple[str, ...]] = ("data.json", "data_head.jsonl")
_NODE_REF: Final = re.compile(r"<node-(\d+)>")

PathLike = str | os.PathLike[str]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UsageError(f"{path} not found: is this a TaskBench dataset folder?") from exc
    except ValueError as exc:
        raise UsageError(f"{path}: not valid JSON ({exc})") from exc


def _nodes(folder: Path) -> list[Mapping[str, Any]]:
    path = folder / "tool_desc.json"
    if not path.exists():
        path = folder / "graph_desc.json"
    data = _read_json(path)
    nodes = data.get("nodes") if isinstance(data, Mapping) else None
    if not isinstance(nodes, list):
        raise UsageError(f"{path}: expected an object with a 'nodes' list")
    return [n for n in nodes if isinstance(n, Mapping)]


def load_tool_graph(folder: PathLike) -> Registry:
    """A registry with one kind per tool of the dataset in ``folder``.

    The kind is the tool's ``id`` and its description the tool's ``desc``; kinds have no
    payload model (any object is accepted).

    Raises:
        UsageError: the folder has no readable ``tool_desc.json`` / ``graph_desc.json``.
    """
    registry = Registry()
    for node in _nodes(Path(folder)):
        registry.add(KindSpec(name=str(node["id"]), description=str(node.get("desc", ""))))
    return registry


def tool_graph_links(folder: PathLike) -> set[tuple[str, str]]:
    """The ``(source, target)`` tool pairs of ``graph_desc.json``: which tool may feed which."""
    path = Path(folder) / "graph_desc.json"
    data = _read_json(path)
    links = data.get("links", []) if isinstance(data, Mapping) else []
    return {
        (str(link["source"]), str(link["target"]))
        for link in links
        if isinstance(link, Mapping) and "source" in link and "target" in link
    }


def _sample_file(folder: Path) -> Path:
    for name in _SAMPLE_FILES:
        if (folder / name).exists():
            return folder / name
    raise UsageError(f"{folder}: no {' or '.join(_SAMPLE_FILES)}: is this a TaskBench folder?")


def iter_samples(folder: PathLike) -> Iterator[dict[str, Any]]:
    """The raw samples of ``folder`` (``data.json`` or ``data_head.jsonl``), in file order.

    Raises:
        UsageError: no sample file, or a line that is not a JSON object.
    """
    path = _sample_file(Path(folder))
    with path.open(encoding="utf-8") as lines:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
            except ValueError as exc:
                raise UsageError(f"{path}:{lineno}: not JSON ({exc})") from exc
            if not isinstance(sample, dict):
                raise UsageError(f"{path}:{lineno}: expected a JSON object per line")
            yield sample


def _edges(names: list[str], links: list[Mapping[str, Any]]) -> set[tuple[int, int]]:
    """``(dependency, dependent)`` index pairs for the tool-name links of one sample."""
    where: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        where.setdefault(name, []).append(i)
    edges: set[tuple[int, int]] = set()
    for link in links:
        sources = where.get(str(link.get("source")), [])
        targets = where.get(str(link.get("target")), [])
        if link.get("source") == link.get("target"):
            if len(sources) == 1:
                edges.add((sources[0], sources[0]))  # a real self-loop; validation says so
            edges.update(itertools.pairwise(sources))
            continue
        edges.update((s, t) for s in sources for t in targets)
    return edges


def _order(n: int, edges: set[tuple[int, int]]) -> list[int]:
    """A topological order of ``n`` nodes (ties in data order), or data order on a cycle."""
    sorter: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
    for i in range(n):
        sorter.add(i)
    for source, target in edges:
        sorter.add(target, source)
    try:
        sorter.prepare()
    except graphlib.CycleError:
        return list(range(n))
    return smallest_order(sorter)


def _renumber(value: Any, position: Mapping[int, int]) -> Any:
    """``value`` with every in-range ``<node-k>`` reference renumbered by ``position``."""
    if isinstance(value, str):

        def swap(match: re.Match[str]) -> str:
            k = int(match.group(1))
            return f"<node-{position[k]}>" if k in position else match.group(0)

        return _NODE_REF.sub(swap, value)
    if isinstance(value, list):
        return [_renumber(v, position) for v in value]
    if isinstance(value, dict):
        return {k: _renumber(v, position) for k, v in value.items()}
    return value


def sample_to_plan(sample: Mapping[str, Any]) -> dict[str, Any]:
    """The plan document of one TaskBench sample (see the module notes for the rules)."""
    nodes = [n for n in sample.get("task_nodes", []) if isinstance(n, Mapping)]
    names = [str(n.get("task")) for n in nodes]
    links = [link for link in sample.get("task_links", []) if isinstance(link, Mapping)]
    edges = _edges(names, links)
    order = _order(len(nodes), edges)
    position = {old: new for new, old in enumerate(order)}
    tasks: list[dict[str, Any]] = []
    for old in order:
        node = nodes[old]
        payload: dict[str, Any] = {}
        if "arguments" in node:
            payload["arguments"] = _renumber(node["arguments"], position)
        depends_on = sorted({position[s] for s, t in edges if t == old})
        tasks.append({"kind": names[old], "payload": payload, "depends_on": depends_on})
    return {"goal": str(sample.get("user_request", "")), "tasks": tasks}


def iter_plans(folder: PathLike) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(sample id, plan document)`` for every sample of the dataset in ``folder``.

    Raises:
        UsageError: no sample file, or a line that is not a JSON object.
    """
    for sample in iter_samples(folder):
        yield str(sample.get("id")), sample_to_plan(sample)
