"""What a plan will cost before it runs: ``estimate``, ``planrun estimate`` and the
``--budget-usd`` refusal; no model call is made."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import FAKE_KEY, StandIn

from planrun import (
    App,
    Model,
    ModelWorker,
    PriceTable,
    Registry,
    UsageError,
    estimate,
    plan_and_run,
)
from planrun.cli import main
from planrun.dev.testing import FakeOpenAI
from planrun.examples.answers import answers
from planrun.examples.ticket_data import generate_tickets
from planrun.examples.tickets import Classification, TicketPayload
from planrun.model import Price


def _app() -> App:
    registry = Registry()
    registry.register("classify_ticket", ModelWorker("classify_ticket", result=Classification),
                      payload=TicketPayload, description="Label one support ticket.")
    registry.register("count", lambda payload, ctx: {"n": len(ctx.inputs)},
                      description="Count the labels.")
    return App(registry)


def _plan(n: int, summary: bool = False) -> dict[str, Any]:
    tasks: list[dict[str, Any]] = [
        {"kind": "classify_ticket", "payload": {"ticket": t.model_dump(mode="json")},
         "depends_on": []} for t in generate_tickets(n, 0)]
    if summary:
        tasks.append({"kind": "count", "payload": {}, "depends_on": list(range(n))})
    return {"goal": "classify the tickets", "tasks": tasks}


def test_calls_tokens_and_the_cost_at_each_allowed_tier() -> None:
    found = estimate(_plan(20, summary=True), _app(), tiers=("flex", "priority"),
                     rpm=60, tpm=100_000)
    assert found.calls == 20 and found.by_kind == {"classify_ticket": 20}  # count is no call
    assert found.model == "gpt-4o-mini" and found.priced
    assert list(found.tiers) == ["flex", "default", "priority"]
    default, flex, priority = (found.tiers[t] for t in ("default", "flex", "priority"))
    assert flex.cost_usd == pytest.approx(default.cost_usd / 2)
    assert default.cost_usd < priority.cost_usd < 2 * default.cost_usd
    assert default.cost_usd < default.cost_usd_max  # outputs at their bounds
    assert found.output_tokens < found.output_tokens_max
    assert found.time_s == pytest.approx(20.0)  # 20 requests at 60 a minute
    assert found.cheapest[0] == "flex"
    bigger = estimate(_plan(40), _app())
    assert bigger.prompt_tokens == pytest.approx(2 * found.prompt_tokens, rel=0.1)
    assert list(bigger.tiers) == ["default"] and bigger.time_s is None


def test_the_schema_sent_counts_in_the_prompt() -> None:
    found = estimate(_plan(1), _app())
    schema = json.dumps(Classification.model_json_schema())
    assert found.prompt_tokens > len(schema) / 4


def test_the_token_limit_counts_prompts_and_output_bounds() -> None:
    found = estimate(_plan(10), _app(), tpm=1_000)
    counted = found.prompt_tokens + found.output_tokens_max
    assert found.time_s == pytest.approx(60.0 * counted / 1_000)


@pytest.mark.parametrize("options, message", [
    ({"tiers": ("flex", "fast")}, "unknown tier 'fast'"),
    ({"model": "gpt-5-nano", "tiers": ("priority",)}, "'gpt-5-nano' has no priority price"),
    ({"rpm": 0}, "rpm must be > 0"),
])
def test_bad_input_is_one_line(options: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        estimate(_plan(2), _app(), **options)


def test_a_model_priced_by_the_caller_and_an_unpriced_one() -> None:
    mine = PriceTable({"mine": Price(1.0, 0.5, 2.0, (2.0, 1.0, 4.0))})
    found = estimate(_plan(3), _app(), model=Model("mine", api_key=FAKE_KEY),
                     prices=mine, tiers=("priority",))
    assert found.tiers["priority"].cost_usd == pytest.approx(2 * found.tiers["default"].cost_usd)
    unknown = estimate(_plan(3), _app(), model="nobody-knows")
    assert not unknown.priced and unknown.tiers["default"].cost_usd == 0.0


def test_the_estimate_is_near_what_the_stand_in_bills() -> None:
    """The real openai SDK over HTTP against the stand-in (counting the response schema in
    the prompt, as the API does): the expected cost is within 25 % of what the run was
    billed, and the ceiling above it."""
    plan = _plan(40)
    found = estimate(plan, _app())
    with StandIn(FakeOpenAI(answers(), count_schema=True)) as server:
        model = Model("gpt-4o-mini", api_key=FAKE_KEY, base_url=server.base_url)
        report = plan_and_run(plan, _app(), model=model)
    billed = report.usage.total.cost_usd
    assert report.ok and report.usage.total.requests == found.calls
    assert found.tiers["default"].cost_usd == pytest.approx(billed, rel=0.25)
    assert found.tiers["default"].cost_usd_max > billed


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _plan_file(tmp_path: Path, n: int = 3) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_plan(n)))
    return str(path)


def test_planrun_estimate_prints_the_figures(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    plan = _plan_file(tmp_path, 5)
    code, out, err = _cli(capsys, "estimate", plan, "--app", "classify_app:app", "--tiers",
                          "flex,priority", "--rpm", "30", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert set(data) == {"model", "calls", "by_kind", "tokens", "tiers", "priced", "rpm",
                         "tpm", "time_s"}
    assert data["calls"] == 5 and data["time_s"] == pytest.approx(10.0)
    assert set(data["tiers"]) == {"flex", "default", "priority"}
    assert set(data["tiers"]["flex"]) == {"cost_usd", "cost_usd_max"}
    code, out, _ = _cli(capsys, "estimate", plan, "--app", "classify_app:app")
    assert code == 0 and "5 model call(s) on gpt-4o-mini" in out and "default" in out


@pytest.mark.parametrize("argv, message", [
    (["--tiers", "flex,fast"], "unknown tier 'fast'"),
    (["--model", "gpt-5-nano", "--tiers", "priority"], "has no priority price"),
    (["--rpm", "-1"], "must be > 0"),
])
def test_planrun_estimate_bad_input_is_one_line_exit_2(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str],
        message: str) -> None:
    code, out, err = _cli(capsys, "estimate", _plan_file(tmp_path), "--app",
                          "classify_app:app", *argv)
    last = err.strip().splitlines()[-1]
    assert code == 2 and message in last and "error:" in last and out == ""
    assert "Traceback" not in err


@pytest.fixture
def endpoint(standin: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    server = standin()
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    return server


def test_a_run_that_cannot_afford_its_plan_is_refused_before_any_call(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, endpoint: Any) -> None:
    plan = _plan_file(tmp_path, 10)
    code, out, err = _cli(capsys, "run", plan, "--app", "classify_app:app", "--budget-usd",
                          "0.0001", "--quiet")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "more than --budget-usd 0.0001" in err and "nothing was spent" in err
    assert endpoint.fake.requests == []  # no model call was made
    code, _, err = _cli(capsys, "run", plan, "--app", "classify_app:app", "--budget-usd",
                        "1", "--quiet")
    assert code == 0, err
    assert len(endpoint.fake.requests) == 10
    code, _, err = _cli(capsys, "run", plan, "--app", "classify_app:app", "--budget-usd",
                        "0.0001", "--force", "--quiet")
    assert code == 1  # forced: it starts, and the budget stops it before any call
    assert len(endpoint.fake.requests) == 10


@pytest.mark.parametrize("argv, message", [
    (["--tiers", "flex,fast"], "unknown tier 'fast'"),
    (["--model", "gpt-5-nano", "--tiers", "priority"], "has no priority price"),
    (["--tiers", "flex", "--deadline", "0"], "must be > 0"),
    (["--tiers", "flex", "--deadline", "-5"], "must be > 0"),
    (["--tiers", "batch", "--workers", "external", "--db", "sqlite:///x.db"],
     "--batch runs with local workers"),
])
def test_planrun_run_bad_tiers_are_one_line_exit_2_and_nothing_is_spent(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, endpoint: Any, argv: list[str],
        message: str) -> None:
    code, _, err = _cli(capsys, "run", _plan_file(tmp_path), "--app", "classify_app:app",
                          *argv)
    last = err.strip().splitlines()[-1]
    assert code == 2 and message in last and "error:" in last and "Traceback" not in err
    assert endpoint.fake.requests == []
