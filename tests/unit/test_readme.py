"""The README's runnable Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_ready_plan_example_runs_and_its_assertion_holds() -> None:
    [block] = [b for b in python_blocks() if "registry = Registry()" in b]
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(block, str(README), "exec"), namespace)
    report = namespace["report"]
    assert report.results() == {"t0": 2, "t1": 4, "t2": 6}  # type: ignore[attr-defined]
    registry = namespace["registry"]
    assert registry["double"].timeout_s == 30  # type: ignore[index]
