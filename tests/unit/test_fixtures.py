"""Cassettes: replay of every committed fixture, misses that explain themselves, the check."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import shutil
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import openai
import pytest
from conftest import REPO

import planrun.model._prompts
from planrun._facade import App, RunReport, aplan_and_run, plan_and_run
from planrun.cli._fixtures import (
    add_cassette_flags,
    add_fixtures_parser,
    cassette_context,
    replay_model,
)
from planrun.core import Registry
from planrun.dev.fixtures import (
    Cassette,
    FixtureMiss,
    RecordedRequest,
    RecordedResponse,
    Stale,
    check,
    replay,
    scrub,
)
from planrun.dev.scenarios import RETRY_AFTER_S, SCENARIOS, get_scenario
from planrun.examples import brief, release, tickets
from planrun.examples.ticket_data import generate_tickets
from planrun.model import Model, RetryPolicy
from planrun.model._prompts import PromptLibrary
from planrun.model._workers import ModelWorker
from planrun.runtime._clock import VirtualClock
from planrun.testing.pytest_plugin import CassetteFixture

FIXTURES = REPO / "fixtures"
SINGLE_CHAIN = ["release", "rate_limited", "server_error", "refusal", "bad_request"]
"""Scenarios whose tasks run one after another: their whole ledger order is reproducible."""


def run_cassette(name: str, **model_options: Any) -> tuple[RunReport, Cassette]:
    """Replay scenario ``name`` from its committed cassette under virtual time."""
    scenario = get_scenario(name)
    with replay(FIXTURES / scenario.file) as cassette:
        clock = VirtualClock()
        report = clock.run(scenario.entry(cassette.model(**model_options), clock))
    return report, cassette


def prompt_copy(tmp_path: Path, name: str, edit: tuple[str, str]) -> Path:
    """A copy of the shipped prompts with one template edited (``old`` -> ``new``)."""
    folder = tmp_path / "prompts"
    shutil.copytree(str(planrun.model._prompts.default_prompt_dir()), folder)
    template = folder / f"{name}.md"
    text = template.read_text(encoding="utf-8")
    assert edit[0] in text
    template.write_text(text.replace(edit[0], edit[1]), encoding="utf-8")
    return folder


MIGRATE_EDIT = ("Do not drop or rewrite data", "Never drop or rewrite data")


# ---- replay of every committed cassette ------------------------------------------------------


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_cassette_replays_to_its_expected_outcome(name: str) -> None:
    scenario = SCENARIOS[name]
    report, cassette = run_cassette(name)
    assert {k: report.counts[k] for k in scenario.counts} == dict(scenario.counts)
    assert cassette.stats.played == scenario.requests == len(cassette.interactions)
    assert cassette.stats.missed == 0 and cassette.unused() == []
    assert report.audit.order_violations == 0 and report.audit.duplicates == 0
    assert report.audit.clean == (report.counts["completed"] == len(report.tasks))


def test_brief_replay_repairs_the_plan_once() -> None:
    report, cassette = run_cassette("brief")
    assert [t.kind for t in report.plan.tasks] == ["research"] * 3 + ["analyse"] * 2 + [
        "write_brief"
    ]
    assert report.usage is not None and report.usage["decompose"].requests == 2
    plans = [i for i in cassette.interactions if i.request.schema_name == "plan"]
    assert sorted(len(p.request.messages) for p in plans) == [1, 3]  # the repair turn


def test_brief_contract_replay_repairs_a_plan_that_did_not_do_the_job() -> None:
    from planrun.examples.answers import PIX_GOAL

    report, cassette = run_cassette("brief_contract")
    assert [t.kind for t in report.plan.tasks] == ["research", "research", "analyse",
                                                   "write_brief"]
    assert report.goal == report.plan.goal == PIX_GOAL and report.ok
    plans = [i for i in cassette.interactions if i.request.schema_name == "plan"]
    repair = next(p for p in plans if len(p.request.messages) == 3)
    asked = repair.request.messages[-1]["content"]
    assert "- duplicate_task (task 2)" in asked and "- no_deliverable (task -)" in asked


def test_tickets_replay_sends_each_reply_once() -> None:
    app, outbox, desk = tickets.make_app()
    plan = tickets.ticket_plan(generate_tickets(200, seed=0), app.registry)
    with replay(FIXTURES / "tickets.json") as cassette:
        report = plan_and_run(plan, app, model=cassette.model(), clock=VirtualClock())
    assert report.counts["completed"] == 400 and not cassette.unused()
    assert len(outbox.sent) + len(desk.flagged) == 200 and outbox.attempts == len(outbox.sent)


def test_triage_replay_grows_from_its_fetch_and_sends_each_reply_once() -> None:
    app, outbox, desk = tickets.make_app()
    plan = tickets.triage_plan(20, app.registry, seed=0)
    assert [t.kind for t in plan.tasks] == ["fetch_tickets"]
    with replay(FIXTURES / "triage.json") as cassette:
        report = plan_and_run(plan, app, model=cassette.model(), clock=VirtualClock())
    assert report.counts["completed"] == 42 and not cassette.unused()
    by_id = {t.id: t for t in report.tasks}
    assert {t.kind for t in report.tasks if t.id != "t0"} == {
        "classify_ticket", "draft_reply", "summarize_triage"}
    assert all(t.id.startswith("t0/") for t in report.tasks if t.id != "t0")
    summary = by_id["t0/40"].result
    assert summary["drafts"] == 20 and sum(summary["by_category"].values()) == 20
    assert summary["needs_human"] == len(desk.flagged)
    assert len(outbox.sent) + len(desk.flagged) == 20 and outbox.attempts == len(outbox.sent)


def _per_task(report: RunReport, *, workers: bool) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = defaultdict(list)
    for event in report.events:
        out[event.task].append((event.event, event.worker) if workers else event.event)
    return dict(out)


def _results(report: RunReport) -> dict[str, tuple[str, Any, str | None]]:
    return {t.id: (t.status, t.result, t.error) for t in report.tasks}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_replaying_twice_gives_identical_ledgers(name: str) -> None:
    # What "identical" can honestly mean: requests match by content, so every replay serves
    # the same recordings and every task goes through the same events to the same result.
    # Under concurrency the interleaving of different tasks' events, and so which worker
    # the balancing router picks, follows the order completions arrive in, and the
    # supervisor runs synchronous effects (the triage's deliver) in threads whose finishing
    # order varies from run to run; that is not part of the contract. A scenario whose
    # tasks run one at a time repeats its whole ledger, workers included, in order.
    first, one = run_cassette(name)
    second, two = run_cassette(name)
    assert sorted(p.index for p in one.log) == sorted(p.index for p in two.log)
    assert _per_task(first, workers=False) == _per_task(second, workers=False)
    assert _results(first) == _results(second)
    if name in SINGLE_CHAIN:
        assert [(e.task, e.event, e.worker) for e in first.events] == [
            (e.task, e.event, e.worker) for e in second.events
        ]
        assert [p.index for p in one.log] == [p.index for p in two.log]


# ---- recorded failures replayed --------------------------------------------------------------


def test_rate_limit_storm_waits_per_retry_after_and_succeeds() -> None:
    # Backoff alone would wait 0.1, 0.2, 0.4 s: each wait of RETRY_AFTER_S is the header's.
    report, cassette = run_cassette(
        "rate_limited", retry=RetryPolicy(attempts=4, base=0.1, jitter=0.0)
    )
    assert report.ok
    migrate = [p for p in cassette.log
               if cassette.interactions[p.index].request.schema_name == "migrate_db"]
    statuses = [cassette.interactions[p.index].response.status for p in migrate]
    assert statuses == [429, 429, 429, 200]
    gaps = [b.at - a.at for a, b in itertools.pairwise(migrate)]
    assert all(RETRY_AFTER_S <= gap < RETRY_AFTER_S + 0.01 for gap in gaps), gaps
    assert next(t for t in report.tasks if t.id == "t0").attempts == 1  # retried in the model


def test_server_errors_are_retried_then_succeed() -> None:
    report, cassette = run_cassette("server_error")
    assert report.ok
    statuses = [cassette.interactions[p.index].response.status for p in cassette.log]
    assert statuses == [200, 500, 500, 200, 200]
    deploy = [cassette.interactions[p.index].request.schema_name for p in cassette.log[1:4]]
    assert deploy == ["deploy_app"] * 3


def test_permanent_400_is_dead_after_one_request() -> None:
    report, cassette = run_cassette("bad_request")
    statuses = {t.id: t.status for t in report.tasks}
    assert statuses == {"t0": "dead", "t1": "cancelled", "t2": "cancelled"}
    dead = next(t for t in report.tasks if t.id == "t0")
    assert dead.error is not None and "PermanentError" in dead.error
    assert "context_length_exceeded" in dead.error and dead.attempts == 1
    assert len(cassette.log) == 1 and report.aborted_by == "t0"


def test_refusal_is_model_refused_and_dead() -> None:
    report, cassette = run_cassette("refusal")
    deploy = next(t for t in report.tasks if t.id == "t1")
    assert deploy.status == "dead" and deploy.error is not None
    assert deploy.error.startswith("ModelRefused") and deploy.attempts == 1
    assert next(t for t in report.tasks if t.id == "t2").status == "cancelled"
    assert len(cassette.log) == 2


# ---- misses ----------------------------------------------------------------------------------


def test_changed_decompose_prompt_raises_fixture_miss_naming_it(tmp_path: Path) -> None:
    folder = prompt_copy(tmp_path, "decompose", ("## Rules", "## Rules to follow"))
    with pytest.raises(FixtureMiss) as caught, replay(FIXTURES / "brief.json") as cassette:
        plan_and_run(brief.GOAL, brief.make_app(), model=cassette.model(),
                     prompts=PromptLibrary(folder), clock=VirtualClock())
    message = str(caught.value)
    assert "the rendered prompt of decompose changed: recorded hash" in message
    assert "re-record" in message and "python tools/make_fixtures.py brief" in message
    assert "+## Rules to follow" in message and "-## Rules" in message  # the diff
    assert caught.value.closest is not None
    assert cassette.interactions[caught.value.closest].request.schema_name == "plan"
    assert len(cassette.misses) == 1 and cassette.log == []  # asked once, never retried


def test_changed_worker_template_fails_the_replay_with_the_template_named(
    tmp_path: Path,
) -> None:
    folder = prompt_copy(tmp_path, "classify_ticket", ("Choose exactly one", "Pick exactly one"))
    app, _, _ = tickets.make_app()
    worker = app.registry["classify_ticket"].handler
    assert isinstance(worker, ModelWorker)
    worker.prompts = PromptLibrary(folder)
    plan = tickets.ticket_plan(generate_tickets(1, seed=0), app.registry)
    with pytest.raises(FixtureMiss, match="classify_ticket changed") as caught, replay(
        FIXTURES / "tickets.json"
    ) as cassette:
        report = plan_and_run(plan, app, model=cassette.model(), clock=VirtualClock())
        # The task died of the miss (a permanent error, not a connection problem) ...
        assert report.counts["dead"] == 1 and report.counts["cancelled"] == 1
    # ... and the replay raised it on exit, with the diff of the edited line.
    assert "+Pick exactly one" in str(caught.value) and len(cassette.misses) == 1


class ChangedMigrationPlan(release.MigrationPlan):
    estimated_minutes: int


def test_changed_result_schema_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release, "MigrationPlan", ChangedMigrationPlan)
    with pytest.raises(FixtureMiss) as caught, replay(FIXTURES / "release.json") as cassette:
        plan_and_run(release.RELEASE_PLAN, release.make_app(), model=cassette.model(),
                     clock=VirtualClock())
    assert "response_format schema changed (schema 'migrate_db')" in str(caught.value)
    assert "estimated_minutes" in str(caught.value)


def test_a_miss_surfaces_at_once_through_the_real_sdk() -> None:
    async def ask() -> None:
        model = cassette.model(retry=RetryPolicy(attempts=4, base=0.1, jitter=0.0))
        await model.complete("a prompt nobody recorded")

    with pytest.raises(FixtureMiss) as caught, replay(FIXTURES / "release.json") as cassette:
        VirtualClock().run(ask())
    assert len(cassette.misses) == 1  # not four: the model did not retry it
    assert "message 0 (user) differs" in str(caught.value)


def test_one_recording_too_few_says_so() -> None:
    with pytest.raises(FixtureMiss, match="recorded 1 time"), replay(
        FIXTURES / "release.json"
    ) as cassette:
        for _ in range(2):
            plan_and_run(release.RELEASE_PLAN, release.make_app(), model=cassette.model(),
                         clock=VirtualClock(), on_dead="abort_run")


def test_unused_lists_interactions_never_played() -> None:
    only_migrate = {"goal": "migrate", "tasks": [release.RELEASE_PLAN["tasks"][0]]}
    app = release.make_app()  # without its contracts: a migration alone is a whole plan here
    app = App(Registry(dataclasses.replace(s, needs=(), delivers=False) for s in app.registry),
              app.workers)
    with replay(FIXTURES / "release.json") as cassette:
        report = plan_and_run(only_migrate, app, model=cassette.model(), clock=VirtualClock())
    assert report.ok
    unused = {i.request.schema_name for i in cassette.unused()}
    assert unused == {"deploy_app", "smoke_test"}
    assert cassette.stats.played == 1 and cassette.stats.unused == 2


# ---- the stale-fixture check -----------------------------------------------------------------


def _fixtures_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="planrun")
    add_fixtures_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    status: int = args.func(args)
    return status


def test_check_passes_on_the_committed_fixtures(capsys: pytest.CaptureFixture[str]) -> None:
    assert check(sorted(FIXTURES.glob("*.json"))) == []
    assert _fixtures_cli(["fixtures", "check", str(FIXTURES)]) == 0
    assert f"fresh: {len(SCENARIOS)} cassettes" in capsys.readouterr().out


def test_check_flags_a_changed_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = prompt_copy(tmp_path, "migrate", MIGRATE_EDIT)
    monkeypatch.setattr(planrun.model._prompts, "default_prompt_dir", lambda: folder)
    stale = check([FIXTURES / "release.json", FIXTURES / "bad_request.json"])
    assert [(Path(s.path).name, s.kind) for s in stale] == [
        ("release.json", "changed"), ("bad_request.json", "changed")
    ]
    assert "the rendered prompt of migrate changed" in stale[0].reason
    status = _fixtures_cli(["fixtures", "check", str(FIXTURES / "release.json")])
    out = capsys.readouterr()
    assert status == 1
    assert "migrate changed" in out.out and "+Never drop or rewrite data" in out.out
    assert "re-record: python tools/make_fixtures.py release" in out.out
    assert "stale: 1 finding(s)" in out.err


def test_check_keeps_going_after_a_change_and_flags_requests_no_longer_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The edited migration prompt is answered with its closest recording, so the deploy and
    # smoke requests after it are still checked (and found fresh).
    folder = prompt_copy(tmp_path, "migrate", MIGRATE_EDIT)
    monkeypatch.setattr(planrun.model._prompts, "default_prompt_dir", lambda: folder)
    assert [s.kind for s in check([FIXTURES / "rate_limited.json"])] == ["changed"] * 4
    monkeypatch.undo()
    data = json.loads((FIXTURES / "release.json").read_text())
    extra = json.loads(json.dumps(data["interactions"][0]))
    extra["request"]["body"]["temperature"] = 0.5
    data["interactions"].append(extra)
    (tmp_path / "release.json").write_text(json.dumps(data))
    stale = check([tmp_path / "release.json"])
    assert [(s.kind, s.index) for s in stale] == [("unplayed", 3)]


def test_check_flags_a_changed_result_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release, "MigrationPlan", ChangedMigrationPlan)
    stale = check([FIXTURES / "release.json"])
    assert stale[0].kind == "changed" and "response_format schema changed" in stale[0].reason
    # The old reply lacks the new field: the worker re-asks once (a request no recording
    # holds), the migration dies, and nothing after it runs:
    assert stale[1].kind == "changed" and "3 message(s)" in stale[1].reason
    assert [s.kind for s in stale[2:]] == ["unplayed", "unplayed"]


def test_check_reports_a_cassette_it_cannot_rerun(tmp_path: Path) -> None:
    data = json.loads((FIXTURES / "release.json").read_text())
    data["about"]["scenario"] = None
    (tmp_path / "mine.json").write_text(json.dumps(data))
    assert [s.kind for s in check([tmp_path / "mine.json"])] == ["unchecked"]


def test_show_summarises_a_cassette(capsys: pytest.CaptureFixture[str]) -> None:
    assert _fixtures_cli(["fixtures", "show", str(FIXTURES / "rate_limited.json")]) == 0
    out = capsys.readouterr().out
    assert "6 interactions" in out and "made: synthesized" in out
    assert "200 x3, 429 x3" in out and "gpt-4o-mini-2024-07-18 x3" in out
    assert "migrate x4" in out and "tokens: " in out and "stand-in" in out


# ---- file format, scrubbing, CLI glue --------------------------------------------------------


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.name)
def test_committed_cassettes_are_canonical_and_described(path: Path) -> None:
    cassette = Cassette.load(path)
    assert path.read_text(encoding="utf-8") == cassette.dumps()  # indent=2, sorted keys
    about = cassette.about
    assert about["made"] == "synthesized" and "not against the OpenAI API" in about["note"]
    assert about["scenario"] == path.stem and about["command"].endswith(path.stem)
    assert about["openai"] and about["planrun"] and len(about["date"]) == 10
    text = path.read_text(encoding="utf-8").lower()
    assert "authorization" not in text and "bearer" not in text and "sk-standin" not in text
    calls = [i for i in cassette.interactions
             if i.request.path.endswith(("/chat/completions", "/responses"))]
    assert all(i.request.prompt is not None for i in calls)  # batch files and polls have none
    assert calls or path.stem == "batch"


def test_scrub_removes_keys_and_known_secrets() -> None:
    key = "sk-proj-AbCdEf0123456789_-xyz"
    data = {"a": f"Incorrect API key provided: {key}.", "task-abcdefgh1234": ["corp-token-42"]}
    cleaned = scrub(data, ["corp-token-42"])
    assert cleaned == {"a": "Incorrect API key provided: sk-***.", "task-abcdefgh1234": ["***"]}


def test_only_the_headers_that_matter_are_kept() -> None:
    response = RecordedResponse.from_http(
        429,
        {"Retry-After": "2", "retry-after-ms": "2000", "x-ratelimit-reset-tokens": "1s",
         "x-request-id": "req_1", "set-cookie": "__cf_bm=secret", "openai-organization": "org-1",
         "openai-project": "proj_1", "date": "today"},
        b'{"error": {"message": "slow down, sk-abcdefghijklmnop"}}',
    )
    assert response.headers == {"retry-after": "2", "retry-after-ms": "2000",
                                "x-ratelimit-reset-tokens": "1s", "x-request-id": "req_1"}
    assert response.body == {"error": {"message": "slow down, sk-***"}}


def test_requests_match_on_canonical_bodies() -> None:
    a = RecordedRequest.from_http("post", "/v1/x", b'{"b": 1, "a": [1, 2]}', "p:1")
    b = RecordedRequest.from_http("POST", "/v1/x", b'{"a":[1,2],"b":1}', "p:2")
    assert a.key == b.key and a.prompt != b.prompt


def test_cassette_context_follows_the_flags(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_cassette_flags(parser)
    with cassette_context(parser.parse_args([])) as nothing:
        assert nothing is None
    with cassette_context(parser.parse_args(["--replay", str(FIXTURES / "release.json")])) as c:
        assert isinstance(c, Cassette) and len(c.interactions) == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["--record", "a.json", "--replay", "b.json"])
    target = tmp_path / "run.json"
    args = parser.parse_args(["--record", str(target)])
    with replay(FIXTURES / "release.json") as cassette, cassette_context(
        args, ["run", "--record", str(target)]
    ):
        report = plan_and_run(release.RELEASE_PLAN, release.make_app(), model=cassette.model(),
                              clock=VirtualClock())
    assert report.ok
    written = Cassette.load(target)
    assert written.about["made"] == "recorded" and len(written.interactions) == 3
    assert written.command == f"planrun run --record {target}"


async def test_scenarios_run_inside_a_running_loop() -> None:
    with replay(FIXTURES / "release.json") as cassette:
        report = await aplan_and_run(release.RELEASE_PLAN, release.make_app(),
                                     model=cassette.model(), on_dead="abort_run")
    assert report.ok and isinstance(cassette.stats.played, int)


def test_stale_reads_as_one_line_per_finding() -> None:
    stale = Stale("fixtures/x.json", 3, "changed", "model changed")
    assert str(stale) == "fixtures/x.json #3: changed: model changed"


class WrappingSDK:
    """A client that wraps every transport exception into APIConnectionError, as openai 1.x
    did (openai 3.x lets an exception that is not httpx's through unwrapped)."""

    api_key = "replay-no-key"
    base_url = "http://replay.planrun.invalid/v1"

    def __init__(self, cassette: Cassette) -> None:
        self.cassette = cassette
        self.calls = 0
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def with_options(self, **options: Any) -> WrappingSDK:
        return self

    async def create(self, **params: Any) -> Any:
        self.calls += 1
        body = {k: v for k, v in params.items() if k in ("model", "messages", "response_format")}
        request = httpx2.Request("POST", f"{self.base_url}/chat/completions", json=body)
        try:
            return self.cassette.serve(request)
        except FixtureMiss as miss:
            raise openai.APIConnectionError(request=httpx2.Request("POST", self.base_url)) from miss


def test_a_miss_wrapped_into_a_connection_error_is_still_raised_as_a_miss() -> None:
    cassette = Cassette.load(FIXTURES / "release.json")
    sdk = WrappingSDK(cassette)
    model = Model("gpt-4o-mini", client=sdk, retry=RetryPolicy(attempts=4, base=0.1, jitter=0.0))  # type: ignore[arg-type]
    with pytest.raises(FixtureMiss, match="re-record"):
        VirtualClock().run(model.complete("a prompt nobody recorded"))
    assert sdk.calls == 1  # a miss is not a connection problem: never retried


@pytest.mark.planrun_cassette("release.json")
def test_the_pytest_fixture_replays_the_marked_cassette(
    planrun_cassette: CassetteFixture,
) -> None:
    report = plan_and_run(release.RELEASE_PLAN, release.make_app(),
                          model=planrun_cassette.model(), clock=VirtualClock(),
                          on_dead="abort_run")
    assert report.ok and planrun_cassette.mode == "replay"
    assert planrun_cassette.cassette.stats.played == 3


def test_replay_model_needs_no_key_and_follows_the_cassette() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    add_cassette_flags(parser)
    assert replay_model(parser.parse_args([])) is None
    args = parser.parse_args(["--replay", str(FIXTURES / "release.json")])
    model = replay_model(args)
    assert model is not None and model.model == "gpt-4o-mini"
    assert ".invalid" in model.base_url
    with cassette_context(args) as cassette:
        report = plan_and_run(release.RELEASE_PLAN, release.make_app(), model=model,
                              clock=VirtualClock())
    assert report.ok and isinstance(cassette, Cassette) and not cassette.unused()


def test_brief_replan_replay_replaces_the_dead_research_and_its_steps() -> None:
    report, cassette = run_cassette("brief_replan")
    by_id = {t.id: t for t in report.tasks}
    dead = [t for t in report.tasks if t.status == "dead"]
    assert [t.kind for t in dead] == ["research"] and dead[0].attempts == 3
    assert "timed out" in (dead[0].error or "")
    replanned = [e for e in report.events if e.event == "replanned"]
    assert [e.task for e in replanned] == [dead[0].id]
    assert len(replanned[0].detail["replaces"]) == 2  # the wallets analysis and the brief
    fragment = replanned[0].detail["tasks"]
    assert [by_id[i].kind for i in fragment] == ["research", "analyse", "write_brief"]
    assert all(by_id[i].status == "completed" for i in fragment)
    # the replacement brief sees the surviving analysis too
    kept = [t.id for t in report.tasks if t.kind == "analyse" and t.status == "completed"
            and t.id not in fragment]
    brief = report.result.tasks[fragment[2]]
    assert set(kept) < set(brief.depends_on)
    plans = [i for i in cassette.interactions if i.request.schema_name == "plan"]
    assert len(plans) == 3 and "timed out" in json.dumps(plans[-1].request.messages)


ONE_HTTP_STACK = """
import importlib.abc, sys

class Blocked(importlib.abc.MetaPathFinder):
    '''Test libraries and the second HTTP stack cannot be imported.'''

    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in {"respx", "httpx", "httpcore", "pytest_httpx2"}:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, Blocked())
"""


def test_a_replay_needs_no_test_library_and_one_http_stack(tmp_path: Path) -> None:
    """``planrun demo``, a replay from Python and the fakes, with respx, httpx and httpcore
    (respx's stack) unimportable: only httpx2, the openai SDK's, is used."""
    import subprocess
    import sys

    code = ONE_HTTP_STACK + """
from planrun.cli import main
from planrun import plan_and_run
from planrun.examples import release
from planrun.testing import FakeOpenAI, answered_by, replay

assert main(["demo"]) == 0
with replay("release") as cassette:
    report = plan_and_run(release.RELEASE_PLAN, release.make_app(), model=cassette.model())
assert report.ok and not cassette.unused()
with answered_by(FakeOpenAI()):
    pass
gone = {"respx", "httpx", "httpcore"} & set(sys.modules)
assert not gone, gone
print("replayed", cassette.stats.played)
"""
    blocked = subprocess.run([sys.executable, "-c", ONE_HTTP_STACK + "import respx"],
                             capture_output=True, text=True, timeout=60, check=False)
    assert "No module named 'respx' (blocked)" in blocked.stderr, blocked.stderr
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=False, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "audit: clean" in done.stdout and "replayed 3" in done.stdout, done.stdout[-2000:]
