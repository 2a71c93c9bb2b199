"""planrun eval records over the wire like every model call, and its cassettes reproduce."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import openai

from planrun.dev.eval import EVALS_DIR, EvalReport, aevaluate, evaluate
from planrun.dev.fixtures import Cassette
from planrun.dev.testing import FakeOpenAI
from planrun.model import Model

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import make_fixtures  # noqa: E402
from standin import StandIn, eval_planner  # noqa: E402

KEY = "sk-proj-Ev4lK3yQz2Xv7Tn1Bm8Hc3Jd6Fs0Gp5Ya2Ue9Io4Wr7Et1Zx3Cv6Bn8Mq0Lk2Jh5Gf"


def test_an_eval_recorded_against_the_standin_replays_the_same(tmp_path: Path) -> None:
    goals = EVALS_DIR / "examples.jsonl"
    versions = {"default": None, "strict": "strict"}
    cassette = tmp_path / "eval.json"

    async def go(base_url: str) -> EvalReport:
        async with Model("gpt-4o-mini", api_key=KEY, base_url=base_url) as model:
            return await aevaluate(goals, versions, model=model, record=cassette)

    with StandIn(FakeOpenAI({"plan": eval_planner(goals)})) as server:
        recorded = asyncio.run(go(server.base_url))
        sent = server.requests
    text = cassette.read_text(encoding="utf-8")
    assert KEY not in text and KEY[8:30] not in text
    assert sent == len(Cassette.load(cassette).interactions) > 12  # really went out
    replayed = evaluate(goals, versions, replay=cassette)
    assert replayed.summaries() == recorded.summaries()
    assert replayed.to_dict() == recorded.to_dict()


def test_make_fixtures_reproduces_the_shipped_eval_cassette(tmp_path: Path) -> None:
    path = make_fixtures.make_eval("examples", live=False, out=tmp_path)
    made = json.loads(path.read_text(encoding="utf-8"))
    shipped = json.loads((EVALS_DIR / "cassettes" / "examples.json").read_text(encoding="utf-8"))
    assert made["about"]["made"] == shipped["about"]["made"] == "synthesized"
    # When and with which SDK release a cassette was made are facts of that day's machine.
    assert made["about"].pop("openai") == openai.__version__
    assert shipped["about"].pop("openai")
    made["about"].pop("date")
    shipped["about"].pop("date")
    assert made == shipped
