"""The README's runnable Python examples run as written."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from planrun.dev.testing import FakeOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from standin import StandIn

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_ready_plan_example_runs_and_its_assertion_holds() -> None:
    [block] = [b for b in python_blocks() if "registry = Registry()" in b and "double" in b]
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(block, str(README), "exec"), namespace)
    report = namespace["report"]
    assert report.results() == {"t0": 2, "t1": 4, "t2": 6}  # type: ignore[attr-defined]
    registry = namespace["registry"]
    assert registry["double"].timeout_s == 30  # type: ignore[index]


def test_the_model_worker_example_runs_against_a_real_http_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every name in it is defined; it runs as written against the stand-in over HTTP."""
    [block] = [b for b in python_blocks() if "ModelWorker(" in b and "plan_and_run(" in b]
    with StandIn(FakeOpenAI()) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "local")
        monkeypatch.chdir(tmp_path)
        namespace: dict[str, object] = {"__name__": "readme_example"}
        # dont_inherit: the block runs as a user's script would, without this module's
        # ``from __future__ import annotations`` (which pydantic cannot resolve in exec).
        exec(compile(block, str(README), "exec", dont_inherit=True), namespace)
        requests = list(server.fake.requests)
    report = namespace["report"]
    assert report.counts["completed"] == 1  # type: ignore[attr-defined]
    (request,) = requests
    assert request.schema_name == "label_ticket"
    assert "Charged twice" in request.prompt
    assert (tmp_path / "my_prompts" / "label_ticket.md").is_file()


def test_the_local_price_example_prices_a_local_model() -> None:
    [block] = [b for b in python_blocks() if "Price(" in b and "Usage(" in b]
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(block, str(README), "exec"), namespace)
    usage = namespace["usage"]
    record = usage.record("qwen2.5:7b-instruct", prompt_tokens=1_000_000,  # type: ignore[attr-defined]
                          completion_tokens=1_000_000)
    assert record.priced and abs(record.cost_usd - 0.15) < 1e-9


def test_the_readme_names_every_model_setting() -> None:
    text = README.read_text(encoding="utf-8")
    for name in ("PLANRUN_STRUCTURED", "PLANRUN_SCHEMA", "PLANRUN_COMPAT", "PLANRUN_API",
                 "OPENAI_BASE_URL", "PLANRUN_MODEL", "xgrammar", "failed to parse grammar",
                 "invalid JSON schema in format", "json_object"):
        assert name in text, name


def test_the_approval_example_runs_and_sends_the_security_reply_after_approval() -> None:
    [block] = [b for b in python_blocks() if "Approval(" in b and "sup.approve(" in b]
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(block, str(README), "exec", dont_inherit=True), namespace)
    result = namespace["result"]
    assert namespace["sent"] == ["r1", "r2"]
    events = [(e.task, e.event) for e in result.events]  # type: ignore[attr-defined]
    assert events.index(("r2", "approved")) < events.index(("r2", "effect"))


def test_the_offline_brief_example_replays_the_shipped_cassette_by_name() -> None:
    [block] = [b for b in python_blocks() if 'replay("brief")' in b]
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(block, str(README), "exec"), namespace)  # its own assert holds
    cassette = namespace["cassette"]
    assert not cassette.unused()  # type: ignore[attr-defined]


def test_a_cassette_name_nobody_ships_is_one_clear_error() -> None:
    from planrun.core import UsageError
    from planrun.dev.fixtures import replay

    with pytest.raises(UsageError, match=r"no cassette 'brieff'.*have .*brief"), \
            replay("brieff"):
        pass


def test_the_failure_example_runs_and_its_assertions_hold() -> None:
    [block] = [b for b in python_blocks() if "raise TransientError" in b]
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(block, str(README), "exec"), namespace)
    assert namespace["seen"] == {"flaky": 2}  # the transient failure was tried again, once


def test_the_app_example_runs_its_effect_once_with_the_key() -> None:
    [block] = [b for b in python_blocks() if "WorkerSpec(" in b and "effects=" in b]
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(block, str(README), "exec"), namespace)  # its assert: the effect, once
    workers = {w.name: w.capacity for w in namespace["app"].worker_specs()}  # type: ignore[attr-defined]
    assert workers == {"crawler": 4, "mailer": 1}
