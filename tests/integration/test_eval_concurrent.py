"""planrun eval at the speed of the server: goals decomposed at once up to a bound, each
outcome written as it is measured, an interrupted evaluation continued (real SDK, real
HTTP, a stand-in answering like a model server with a few slots)."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path

import pytest

from planrun.cli import main
from planrun.core import TransientError, UsageError
from planrun.dev.eval import EVALS_DIR, EvalReport, aevaluate
from planrun.dev.testing import FakeOpenAI
from planrun.model import Model, RetryPolicy

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
from standin import StandIn, eval_planner  # noqa: E402

GOALS = EVALS_DIR / "examples.jsonl"
VERSIONS = {"default": None, "strict": "strict"}
KEY = "sk-standin-eval-00000000000000000000"


def _evaluate(base_url: str, **options: object) -> EvalReport:
    async def go() -> EvalReport:
        async with Model("gpt-4o-mini", api_key=KEY, base_url=base_url,
                         retry=RetryPolicy(attempts=2, base=0.01, cap=0.02)) as model:
            return await aevaluate(GOALS, VERSIONS, model=model, **options)  # type: ignore[arg-type]

    return asyncio.run(go())


def test_goals_run_at_once_up_to_the_bound_and_measure_the_same(tmp_path: Path) -> None:
    seen: list[tuple[str, int, int]] = []
    with StandIn(FakeOpenAI({"plan": eval_planner(GOALS)}), slots=8, latency=0.05) as server:
        one = _evaluate(server.base_url, concurrency=1)
        alone = server.most_busy
        server.most_busy = 0
        four = _evaluate(server.base_url, concurrency=4, out=tmp_path / "out.jsonl",
                         on_outcome=lambda v, o, done, total: seen.append((v, done, total)))
        together = server.most_busy
    assert alone == 1 and together == 4  # never more than the bound, and the bound is used
    assert four.to_dict() == one.to_dict()  # the same measurements, in goal order
    assert [done for _, done, _ in seen] == list(range(1, 13))
    assert {total for _, _, total in seen} == {12}
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(lines) == 12
    assert {(d["version"], d["id"]) for d in lines} == {
        (v, o.id) for v in VERSIONS for o in one[v].outcomes}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_interrupted_eval_keeps_its_outcomes_and_continues(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    planner = eval_planner(GOALS)
    answered = {"n": 0}

    def flaky(req: object) -> object:
        answered["n"] += 1
        return planner(req)

    with StandIn(FakeOpenAI({"plan": flaky})) as server:
        full = _evaluate(server.base_url, concurrency=1)
        # Half the goals measured, then the server goes away mid-evaluation.
        first = [g for i, g in enumerate(GOALS.read_text().splitlines()) if i < 3]
        half = tmp_path / "half.jsonl"
        half.write_text("\n".join(first) + "\n")

        async def go() -> EvalReport:
            async with Model("gpt-4o-mini", api_key=KEY, base_url=server.base_url) as model:
                return await aevaluate(half, {"default": None}, model=model, out=out)

        asyncio.run(go())
    kept = out.read_text().splitlines()
    assert len(kept) == 3
    with out.open("a") as f:
        f.write('{"version": "default", "id": "cut sh')  # the line being written at the stop
    dead = f"http://127.0.0.1:{_free_port()}/v1"
    with pytest.raises(TransientError):
        _evaluate(dead, out=out)
    assert out.read_text().splitlines()[:3] == kept  # nothing measured was lost
    # Continued against a live server: only what is missing is measured.
    with StandIn(FakeOpenAI({"plan": flaky})) as server:
        before = answered["n"]
        resumed = _evaluate(server.base_url, out=out)
        asked = answered["n"] - before
    assert resumed.summaries()["default"]["goals"] == 6
    assert resumed.to_dict() == full.to_dict()
    assert 0 < asked < answered["n"] - asked  # fewer requests than a full evaluation


def test_eval_cli_bad_out_and_unreachable_server(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    code = main(["eval", "examples", "--replay", "examples", "--out",
                 str(tmp_path / "no" / "such" / "dir" / "out.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot write the outcomes to" in err
    assert main(["eval", "examples", "--replay", "examples", "--concurrency", "0"]) == 2
    assert "concurrency must be a whole number >= 1" in capsys.readouterr().err
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{_free_port()}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("PLANRUN_TIMEOUT", "2")
    out = tmp_path / "out.jsonl"
    code = main(["eval", "examples", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("planrun: error:")
    with pytest.raises(UsageError):
        asyncio.run(aevaluate(GOALS, concurrency=0))
