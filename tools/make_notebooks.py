"""Write the notebooks in ``notebooks/`` from their source here.

The notebooks' source lives here, as plain Python strings, so a change to a notebook reads
as a normal diff in review. Each ``.ipynb`` is written with stable cell ids, then run top
to bottom (offline, from a scratch folder) and stored with its outputs, so it shows them
on the repository page.

    python tools/make_notebooks.py            # (re)write and run every notebook
    python tools/make_notebooks.py --check    # exit 1 when one is out of date or unrun

CI runs ``--check`` and executes every notebook again (``tests/integration/
test_notebooks.py``), comparing the fresh outputs with the stored ones (run ids,
durations and scratch paths masked). They replay the shipped recordings, from any
folder. Only ``LIVE = True`` in a notebook's first code cell makes it talk to the
configured endpoint: a key in the environment alone never does.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"


def md(text: str) -> tuple[str, str]:
    """A markdown cell."""
    return "markdown", textwrap.dedent(text).strip("\n")


def code(text: str) -> tuple[str, str]:
    """A code cell."""
    return "code", textwrap.dedent(text).strip("\n")


# ---------------------------------------------------------------------------------------------
# decompose_prompt.ipynb
# ---------------------------------------------------------------------------------------------

DECOMPOSE_PROMPT = [
    md("""
        # Iterating on the decomposition prompt

        The decomposer turns a prose goal into a validated plan with one prompt,
        `prompts/decompose.md`. This notebook is the loop for working on it:

        1. **the template**: its text and variables, rendered for the competitive-brief goal
           and the brief's kinds, with the hash every model call records;
        2. **a decomposition**: the model's first answer is invalid, the validator lists the
           problems, the decomposer asks for a repair, and the repaired plan is drawn as a
           dependency graph;
        3. **edit the prompt and compare**: a rule is added to a *copy* of the template, the
           two renders are diffed side by side, and the two plans are compared;
        4. **stale recordings**: `planrun fixtures check` flags the recording the edit made
           stale, and says how to re-record it.

        Offline (the default, and in CI) the model's answers are replayed from
        `fixtures/brief.json`; nothing leaves the machine and no key is needed. With
        `LIVE = True` in the first code cell (and `OPENAI_API_KEY` set), the same cells talk to
        the configured endpoint (its traffic is
        recorded to a scratch cassette so the analysis below reads it the same way), and
        section 3 really decomposes with the edited prompt.

        The repository's `prompts/` folder is only read, never written.
        """),
    code("""
        import concurrent.futures
        import difflib
        import io
        import json
        import os
        import shutil
        import subprocess
        import sys
        import tempfile
        import textwrap
        from contextlib import contextmanager
        from pathlib import Path

        import matplotlib

        matplotlib.use("Agg")  # headless (CI); show() below embeds each figure as a PNG
        import matplotlib.pyplot as plt
        from IPython.display import HTML, Image, display

        from planrun import Model, decompose, validate_plan
        from planrun.dev.fixtures import FixtureMiss, check, record
        from planrun.examples import brief
        from planrun.model import PromptLibrary, Usage, default_prompt_dir, describe_kinds
        from planrun.testing import replay, shipped_cassette

        LIVE = False  # True: call the configured endpoint (OPENAI_API_KEY) instead; it costs money

        # The shipped templates and recording: found from any folder, in a checkout or a wheel.
        PROMPTS = Path(str(default_prompt_dir()))
        FIXTURE = shipped_cassette("brief")
        WORK = Path(tempfile.mkdtemp(prefix="planrun-decompose-"))  # scratch copies live here
        MIN_TASKS, MAX_TASKS = 3, 8  # decompose()'s defaults, which the recording was made with

        app = brief.make_app()
        print("LIVE: the configured endpoint" if LIVE
              else f"offline: replaying {FIXTURE.name}")


        @contextmanager
        def model_session(label):
            # Offline: the brief cassette, replayed (a request it has no recording for raises
            # FixtureMiss). Live: a real Model whose traffic is recorded to a scratch cassette,
            # so the cells below can read the conversation the same way in both modes.
            if LIVE:
                scratch = WORK / f"live-{label}.json"
                with record(scratch, command="decompose_prompt.ipynb (live)") as recorder:
                    yield Model(), recorder.cassette
            else:
                with replay(FIXTURE) as cassette:
                    yield cassette.model(), cassette

        def show(fig):
            # matplotlib.use("Agg") keeps the notebook headless (CI) but also switches off the
            # inline backend, so plt.show() would display nothing: embed the figure as a PNG.
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
            plt.close(fig)
            display(Image(buffer.getvalue()))
        """),
    md("""
        ## 1. The template

        `PromptLibrary` points at the repository's `prompts/` folder, so an edit to
        `prompts/decompose.md` shows up here on the next run. Placeholders use
        `string.Template` syntax (`$goal`, `${min_tasks}`), so the JSON example in the
        template keeps its braces.
        """),
    code("""
        library = PromptLibrary(PROMPTS)
        template = library.get("decompose")
        print(f"{template.name}: {len(template.source.splitlines())} lines; "
              f"variables: {', '.join(template.variables)}")
        print("-" * 92)
        print(template.source)
        """),
    md("""
        Rendered with the same values `decompose()` uses: the goal, the registry's kinds
        described by `describe_kinds` (name, description and payload schema of each), and
        the task bounds. The hash (name and rendered text) goes with every model call, and
        the cassette matches requests on the rendered text, so any edit changes what a
        replay expects.
        """),
    code("""
        variables = dict(goal=brief.GOAL, kinds=describe_kinds(app.registry),
                         min_tasks=MIN_TASKS, max_tasks=MAX_TASKS)
        rendered = library.render("decompose", **variables)
        print(f"rendered {rendered.name}: hash {rendered.hash}, {len(rendered.text)} characters, "
              f"{len(rendered.text.splitlines())} lines")
        print("-" * 92)
        print(rendered.text)
        """),
    md("""
        ## 2. Decompose: the invalid first attempt and its repair

        `decompose()` asks for a plan with the plan schema as the response format, validates
        the answer, and when it is invalid sends the model its answer back with the list of
        problems, asking for a corrected plan. The recording holds one such repair.
        """),
    code("""
        usage = Usage()
        with model_session("original") as (model, cassette):
            plan = decompose(brief.GOAL, app.registry, model, prompts=library, meter=usage)
        calls = usage["decompose"].requests
        print(f"plan validated after {calls} model call(s) ({calls - 1} repair(s))")
        """),
    md("""
        The conversation is in the cassette. A cassette keeps its interactions sorted by
        request body, not in the order they were made, so the first attempt is told apart by
        its conversation: just the rendered prompt (one message), where a repair request
        carries three (the prompt, the previous answer, the problem list). Validating the
        first recorded answer again with `validate_plan` shows exactly what the decomposer
        saw.
        """),
    code("""
        def reply(interaction):
            return interaction.response.body["choices"][0]["message"]["content"]

        attempts = [i for i in cassette.interactions
                    if i.request.prompt is not None and i.request.prompt.name == "decompose"]
        first = next(i for i in attempts if len(i.request.messages) == 1)
        repairs = [i for i in attempts if len(i.request.messages) == 3]
        same = (first.request.messages[0]["content"] == rendered.text
                and first.request.prompt.hash == rendered.hash)
        print("what was sent is the render above, same text and hash:", same)

        bounds = dict(min_tasks=MIN_TASKS, max_tasks=MAX_TASKS)
        problems = validate_plan(reply(first), app.registry, **bounds)
        print(f"first attempt: {len(problems)} problem(s)")
        for p in problems:
            print(f"  {p.code:<19} task {'-' if p.task is None else p.task}: {p.message}")

        try:
            first_tasks = json.loads(reply(first))["tasks"]
        except (ValueError, KeyError, TypeError):
            first_tasks = []
        print("\\nthe first attempt's tasks:")
        for n, t in enumerate(first_tasks):
            codes = ", ".join(p.code for p in problems if p.task == n)
            mark = f"  <- {codes}" if codes else ""
            print(f"  {n}  {t.get('kind', '?'):<15} depends_on {t.get('depends_on')}{mark}")
        """),
    md("""
        The repair request repeats the prompt, quotes the invalid answer, and lists the
        problems by code and task, in the words of `repair_message`. The repaired answer
        validates, and it is the plan `decompose()` returned.
        """),
    code("""
        if repairs:
            sent = repairs[-1].request.messages[2]["content"]
            print(sent)
            final_problems = validate_plan(reply(repairs[-1]), app.registry, **bounds)
            print(f"\\nthe repaired answer has {len(final_problems)} problem(s): "
                  f"{len(plan.tasks)} tasks in waves {plan.levels()}")
        else:
            print("the first attempt was valid; no repair was needed")
        """),
    md("""
        The plan as a dependency graph: one column per wave of `Plan.levels()` (a wave
        depends only on earlier waves, and its tasks run in parallel), one arrow per
        `depends_on` edge.
        """),
    code("""
        KIND_COLOURS = {"research": "#cfe2f3", "analyse": "#fce5cd", "write_brief": "#d9ead3"}


        def draw_plan(ax, plan, title):
            waves = plan.levels()
            tallest = max(len(w) for w in waves)
            pos = {i: (x, (len(wave) - 1) / 2 - row)
                   for x, wave in enumerate(waves) for row, i in enumerate(wave)}
            boxes = {}
            for i, task in enumerate(plan.tasks):
                x, y = pos[i]
                colour = KIND_COLOURS.get(task.kind, "#eeeeee")
                boxes[i] = ax.text(x, y, f"{task.kind} #{i}", ha="center", va="center", fontsize=10,
                                   bbox=dict(boxstyle="round,pad=0.35", fc=colour, ec="0.35"))
                # the payload's first text field (topic, question, audience), under the box
                detail = next((v for v in task.payload.values() if isinstance(v, str)), "")
                detail = textwrap.fill(textwrap.shorten(detail, 70, placeholder="..."), 30)
                ax.text(x, y - 0.13, detail, ha="center", va="top", fontsize=7, color="0.3")
            for i, task in enumerate(plan.tasks):
                for d in task.depends_on:  # from the right edge of d's box to the left edge of i's
                    ax.annotate("", xy=(0, 0.5), xycoords=boxes[i].get_bbox_patch(),
                                xytext=(1, 0.5), textcoords=boxes[d].get_bbox_patch(),
                                arrowprops=dict(arrowstyle="-|>", color="0.45", lw=1.2,
                                                shrinkA=1, shrinkB=1))
            ax.set_xlim(-0.6, len(waves) - 0.4)
            ax.set_ylim(-tallest / 2 - 0.2, tallest / 2)
            ax.set_axis_off()
            ax.set_title(title, fontsize=11)


        fig, ax = plt.subplots(figsize=(11, 4.5))
        draw_plan(ax, plan, f"{plan.goal}\\n{len(plan.tasks)} tasks, {len(plan.levels())} waves")
        fig.tight_layout()
        show(fig)
        """),
    md("""
        ## 3. Edit the prompt and compare

        The edit happens in a copy of `prompts/` in a scratch folder, so the repository stays
        as it is: one more rule. To try your own, change `RULE` (or edit the copy freely) and
        run the cells again; to keep it, make the same edit in `prompts/decompose.md` and
        re-record (section 4).
        """),
    code("""
        RULE = "7. Use at most one research task per competitor group."

        EDITED = WORK / "prompts"
        shutil.copytree(PROMPTS, EDITED, dirs_exist_ok=True)
        source = (PROMPTS / "decompose.md").read_text(encoding="utf-8")
        anchor = "\\n\\n## Answer"  # the rule goes at the end of the rules list
        source = source.replace(anchor, f"\\n{RULE}{anchor}")
        (EDITED / "decompose.md").write_text(source, encoding="utf-8")

        edited_library = PromptLibrary(EDITED)
        edited = edited_library.render("decompose", **variables)
        print(f"original {rendered.hash}  ->  edited {edited.hash}")

        diff = difflib.unified_diff(rendered.text.splitlines(), edited.text.splitlines(),
                                    "original (rendered)", "edited (rendered)", n=3, lineterm="")
        print("\\n".join(diff))
        """),
    md("""
        The same diff side by side (the rendered prompts, with three lines of context):
        """),
    code("""
        table = difflib.HtmlDiff(wrapcolumn=72).make_table(
            rendered.text.splitlines(), edited.text.splitlines(),
            "original prompt", "edited prompt", context=True, numlines=3)
        style = ("<style>table.diff {font-family: monospace; font-size: 12px;"
                 " border: 1px solid #ccc} .diff_add {background: #aaffaa}"
                 " .diff_chg {background: #ffff77}"
                 " .diff_sub {background: #ffaaaa} .diff_header {background: #e0e0e0}</style>")
        display(HTML(style + table))
        """),
    md("""
        Now decompose with the edited prompt. Live, that is a new model call and the two
        plans are drawn side by side. Offline there is no answer for it: the cassette holds
        the answers to the *original* prompt, and replay refuses to guess. The miss says
        which template's render changed (by hash, with a diff of the message) and which
        command re-records the cassette.
        """),
    code("""
        edited_plan, miss = None, None
        try:
            with model_session("edited") as (model, _):
                edited_plan = decompose(brief.GOAL, app.registry, model, prompts=edited_library)
        except FixtureMiss as exc:
            miss = exc

        if miss is not None:
            print(f"FixtureMiss: {miss}")
        else:
            print(f"edited prompt: {len(edited_plan.tasks)} tasks in waves {edited_plan.levels()}")
        """),
    code("""
        fig, (left, right) = plt.subplots(1, 2, figsize=(16, 4.8))
        draw_plan(left, plan, "original prompt" + ("" if LIVE else " (recorded)"))
        if edited_plan is not None:
            draw_plan(right, edited_plan, "edited prompt (live)")
        else:
            right.set_axis_off()
            right.set_title("edited prompt", fontsize=11)
            right.text(0.5, 0.5,
                       "no recording for this prompt\\n\\n"
                       "FixtureMiss: the rendered prompt of decompose changed\\n"
                       f"recorded hash {rendered.hash}, now {edited.hash}\\n\\n"
                       f"re-record with: {miss.command}\\n"
                       "(or set LIVE = True, with OPENAI_API_KEY)",
                       ha="center", va="center", fontsize=10, family="monospace",
                       bbox=dict(boxstyle="round,pad=0.8", fc="#fff2cc", ec="#b45f06"))
        fig.tight_layout()
        show(fig)
        """),
    md("""
        ## 4. `planrun fixtures check` flags the stale recording

        `planrun.dev.fixtures.check(paths)` re-runs each cassette's scenario (here `brief`:
        decompose the goal, run the plan) against the cassette: every request the current
        code sends that has no exact recording is reported as `changed`, with the same
        explanation a miss gives, and answered with the closest recording so the rest of the
        run is checked too.

        The scenario takes its templates from the repository's `prompts/`, which this
        notebook never edits. So the mismatch is made from the other side: a copy of the
        cassette whose two decompose requests are rewritten as if they had been recorded with
        the edited prompt. Against the repository's template that recording is stale in
        exactly the way a recording is after an edit of the template.
        """),
    code("""
        scratch = WORK / "brief.json"
        shutil.copy(FIXTURE, scratch)
        fresh = check([scratch])  # runs its scenario on a private thread inside this loop
        print(f"as recorded: {len(fresh)} stale finding(s)")

        document = json.loads(FIXTURE.read_text(encoding="utf-8"))
        for item in document["interactions"]:
            request = item["request"]
            if (request.get("prompt") or {}).get("name") == "decompose":
                request["body"]["messages"][0]["content"] = edited.text
                request["prompt"]["hash"] = edited.hash
        drifted = WORK / "brief-edited.json"
        drifted.write_text(json.dumps(document, indent=2, sort_keys=True) + "\\n", encoding="utf-8")

        stale = check([drifted])
        print(f"recorded with the edited prompt: {len(stale)} stale finding(s)")
        for item in stale:  # the reason goes on with a diff of the message; its head will do
            print(f"  #{item.index} {item.kind}: {item.reason.split('; message')[0]}")
        """),
    md("""
        The command line runs the same check on files and exits 0 when every cassette is
        fresh, 1 when one is stale (CI runs it over `fixtures/`).
        """),
    code("""
        script = Path(sys.executable).with_name("planrun")
        PLANRUN = [str(script)] if script.is_file() else [
            sys.executable, "-c", "import sys; from planrun.cli import main; sys.exit(main())"]

        exit_status = {}
        for folder, name in ((FIXTURE.parent, FIXTURE.name), (WORK, "brief-edited.json")):
            done = subprocess.run([*PLANRUN, "fixtures", "check", name], cwd=folder,
                                  capture_output=True, text=True, timeout=120)
            exit_status[name] = done.returncode
            print(f"$ planrun fixtures check {name}    # exit status {done.returncode}")
            print(textwrap.indent((done.stdout + done.stderr).rstrip(), "  "), end="\\n\\n")
        """),
    md("""
        To keep an edit: make it in `prompts/decompose.md`, re-record with the command the
        miss names (`python tools/make_fixtures.py brief` against the local stand-in, or
        `OPENAI_API_KEY=... python tools/make_fixtures.py --live brief` against the API),
        check that `planrun fixtures check` is clean, and commit the template and the
        cassette together.
        """),
    code("""
        shutil.rmtree(WORK, ignore_errors=True)
        """),
]


# ---------------------------------------------------------------------------------------------
# ticket_run.ipynb
# ---------------------------------------------------------------------------------------------

TICKET_RUN = [
    md("""
        # The 200-ticket triage, and the three numbers to watch

        The nightly triage example: each of 200 generated tickets (seed 0) is classified,
        then a reply is drafted from the classification; the supervisor sends each finished
        reply once, or flags the ticket for the human desk. Eight workers take four tasks at
        a time.

        The supervisor-worker article names three numbers to instrument in such a run, and
        `planrun.obs.timeline` computes them from the run's ledger:

        * **tasks by status**: is the run converging?
        * **active tasks per worker**: is the load spread, or is one worker pinned while the
          others idle?
        * **age of the oldest unfinished task**: a task stuck in `assigned` shows up as an age
          that climbs while everything else looks healthy.

        Offline (the default, and in CI) the model's 400 answers are replayed from
        `fixtures/tickets.json`: the tickets and the plan are built exactly as the recorded
        scenario (`planrun.scenarios`) builds them, so every request matches its recording.
        With `LIVE = True` in the first code cell (and `OPENAI_API_KEY` set) the run goes to
        the configured endpoint instead; a key alone never makes a call.
        """),
    code("""
        import io
        import math
        import os
        from collections import Counter
        from pathlib import Path

        import matplotlib

        matplotlib.use("Agg")  # headless (CI); show() below embeds each figure as a PNG
        import matplotlib.pyplot as plt
        from IPython.display import Image, display

        from planrun import Model
        from planrun.examples import tickets
        from planrun.examples.ticket_data import generate_tickets
        from planrun import plan_and_run
        from planrun.dev.scenarios import TICKETS
        from planrun.obs import timeline
        from planrun.testing import replay, shipped_cassette

        LIVE = False  # True: call the configured endpoint (OPENAI_API_KEY) instead; it costs money
        FIXTURE = shipped_cassette("tickets")  # found from any folder
        TICKET_COUNT, SEED = TICKETS, 0  # what the recording holds (200); other values miss offline

        app, outbox, desk = tickets.make_app()
        plan = tickets.ticket_plan(generate_tickets(TICKET_COUNT, seed=SEED), app.registry)
        workers = [w.name for w in app.worker_specs()]
        capacity = app.worker_specs()[0].capacity
        kinds = dict(Counter(t.kind for t in plan.tasks))
        print(f"{len(plan.tasks)} tasks {kinds} on {len(workers)} workers x {capacity}")
        print("LIVE: the configured endpoint" if LIVE
              else f"offline: replaying {FIXTURE.name}")

        def show(fig):
            # matplotlib.use("Agg") keeps the notebook headless (CI) but also switches off the
            # inline backend, so plt.show() would display nothing: embed the figure as a PNG.
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
            plt.close(fig)
            display(Image(buffer.getvalue()))
        """),
    md("""
        ## The run

        `plan_and_run` is synchronous; inside the notebook's own event loop it runs on a
        private thread (`await aplan_and_run(...)` works as well).
        """),
    code("""
        if LIVE:
            report = plan_and_run(plan, app, model=Model())
        else:
            with replay(FIXTURE) as cassette:
                report = plan_and_run(plan, app, model=cassette.model())
            print(f"cassette: {cassette.stats}")

        print(report.summary())
        print(f"replies sent: {len(outbox.sent)} ({outbox.attempts} send calls), "
              f"flagged for a human: {len(desk.flagged)}")
        labels = Counter(t.result["category"] for t in report.tasks
                         if t.kind == "draft_reply" and t.status == "completed")
        print("labels:", dict(labels.most_common()))
        """),
    code("""
        effects = Counter(e.task for e in report.events if e.event == "effect")
        drafts = {t.id for t in report.tasks if t.kind == "draft_reply"}
        keys = {f"{report.run_id}:{task}" for task in drafts}  # the supervisor's effect keys

        # Every reply is sent once: one send call per sent reply, one reply per ticket, and
        # one effect per drafted ticket in the ledger (sent or flagged, never both, never twice).
        print(f"completed: {report.counts['completed']} of {2 * TICKET_COUNT} tasks")
        print(f"audit: {report.audit.describe()}")
        print(f"send calls {outbox.attempts} for {len(outbox.sent)} replies, to "
              f"{len({r['ticket_id'] for r in outbox.sent.values()})} different tickets")
        print(f"sent or flagged: {len(set(outbox.sent) | set(desk.flagged))} of {len(keys)} "
              f"drafts; both sent and flagged: {len(set(outbox.sent) & set(desk.flagged))}")
        print(f"effects in the ledger: {sum(effects.values())} for {len(drafts)} drafts, "
              f"at most {max(effects.values())} per draft")
        """),
    md("""
        ## The three numbers over time

        `timeline(report.events, points=...)` replays the ledger and samples the three numbers
        at evenly spaced instants. A replay answers every request at once, so the time axis
        here is the supervisor's own work, about a second for 400 tasks; a live run spreads the
        same shapes over minutes.
        """),
    code("""
        # The instants below are this machine's own timings: they vary from run to run.
        samples = timeline(report.events, points=300)
        at = [s.at for s in samples]
        statuses = [k for k in samples[-1].counts if any(s.counts[k] for s in samples)]
        print(f"{len(samples)} samples over {at[-1]:.2f} s; statuses seen: {', '.join(statuses)}")
        print(f"{'at (s)':>7}  {'tasks by status':<58} {'active (all workers)':>20}  "
              "oldest unfinished")
        for s in samples[:: len(samples) // 6] + samples[-1:]:
            counts = ", ".join(f"{k} {v}" for k, v in s.counts.items() if v)
            oldest = "-" if s.oldest_unfinished_s is None else f"{s.oldest_unfinished_s:.2f} s"
            print(f"{s.at:7.2f}  {counts:<58} {sum(s.active_by_worker.values()):>20}  {oldest}")
        """),
    code("""
        STATUS_COLOURS = {"pending": "#bdbdbd", "assigned": "#9ecae1", "running": "#3182bd",
                          "completed": "#31a354", "failed": "#fd8d3c", "dead": "#de2d26",
                          "cancelled": "#756bb1"}

        fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 10), sharex=True)

        ax1.stackplot(at, *[[s.counts[k] for s in samples] for k in statuses], labels=statuses,
                      colors=[STATUS_COLOURS.get(k, "0.5") for k in statuses], alpha=0.9)
        ax1.set_ylabel("tasks")
        ax1.set_ylim(0, len(plan.tasks))
        ax1.set_title("1. tasks by status: is the run converging?", loc="left")
        ax1.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)

        cmap = plt.get_cmap("tab10")
        for n, worker in enumerate(workers):
            ax2.plot(at, [s.active_by_worker.get(worker, 0) for s in samples], label=worker,
                     color=cmap(n % 10), lw=1.4, drawstyle="steps-post")
        ax2.axhline(capacity, color="0.3", ls=":", lw=1)
        ax2.annotate(f"capacity: {capacity} running at once", (at[0], capacity), xytext=(4, 3),
                     textcoords="offset points", ha="left", va="bottom", fontsize=8, color="0.3")
        ax2.set_ylabel("tasks running")
        ax2.set_title("2. active tasks per worker: is the load spread?", loc="left")
        ax2.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=8)

        ages = [math.nan if s.oldest_unfinished_s is None else s.oldest_unfinished_s
                for s in samples]
        ax3.plot(at, ages, color="#de2d26", lw=1.6)
        ax3.set_ylabel("seconds")
        ax3.set_xlabel("seconds since the run's first event")
        ax3.set_title("3. age of the oldest unfinished task: is anything stuck?", loc="left")
        ax3.set_ylim(bottom=0)
        ax3.set_xlim(0, at[-1])

        fig.tight_layout()
        show(fig)
        """),
    md("""
        How to read them:

        1. **Tasks by status.** The supervisor hands out every ready task at once, so the
           classifications go straight to `assigned` (queued on a worker) and the drafts wait
           in `pending` for their classification; the green band growing steadily to 400 is
           the run converging.
        2. **Active tasks per worker.** `timeline` counts the tasks running on each worker
           (at most `capacity` at once; the ones queued on it are `assigned`, not active).
           The eight lines lie on top of each other: the load is spread evenly, and the
           queues drain together.
        3. **Age of the oldest unfinished task.** All 400 tasks are created in the first few
           milliseconds, so this age is simply the time since the start until the last task
           finishes; it returns to nothing when the run ends. The alarm is this line still
           climbing after the status counts stop moving: a task stuck in `assigned`.
        """),
]


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------------
# strategies.ipynb
# ---------------------------------------------------------------------------------------------

STRATEGIES = [
    md("""
        # Work distribution strategies, in virtual time

        The supervisor-worker pattern's workload: three long tasks and six short ones,
        `[10, 2, 2, 10, 2, 2, 10, 2, 2]` seconds, on three workers. The real supervisor runs each
        strategy in virtual time (nothing sleeps), and a Gantt chart per strategy shows where the
        time goes. Change `DURATIONS` or `WORKERS` and run all cells again.
        """),
    code("""
        import matplotlib
        %matplotlib inline
        import matplotlib.pyplot as plt

        from planrun.core import STRATEGIES
        from planrun.dev.sim import Scenario, simulate

        DURATIONS = [10, 2, 2, 10, 2, 2, 10, 2, 2]
        WORKERS = 3
        scenario = Scenario.from_durations(DURATIONS, WORKERS)
        results = {s: simulate(scenario, s) for s in STRATEGIES}
        for name, r in results.items():
            print(f"{name:<13} makespan {r.makespan:>5g} s   mean task {r.mean_task_s:.2f} s")
        """),
    md("""
        Each bar is one task on the worker that ran it. Round-robin pins the three long tasks on
        `w1` while the others idle; balanced (capable workers, least estimated load, longest task
        first) reaches the optimum.
        """),
    code("""
        def gantt(ax, run, title):
            workers = sorted({t.assigned_to for t in run.tasks.values()})
            for row, worker in enumerate(workers):
                for t in run.tasks.values():
                    if t.assigned_to == worker:
                        ax.barh(row, t.finished_at - t.started_at, left=t.started_at,
                                color="tab:red" if t.estimate_s >= 10 else "tab:blue",
                                edgecolor="white")
            ax.set_yticks(range(len(workers)), workers)
            ax.set_title(f"{title}: makespan {run.makespan:g} s")
            ax.set_xlim(0, 32)

        fig, axes = plt.subplots(len(results), 1, figsize=(8, 2 * len(results)), sharex=True)
        for ax, (name, r) in zip(axes, results.items()):
            gantt(ax, r.run, name)
        axes[-1].set_xlabel("seconds (virtual)")
        fig.tight_layout()
        plt.show()
        """),
    md("""
        ## Capability routing

        A summarisation takes the specialist 4 s and the generalist 16 s. Round-robin sends half of
        them to the generalist (10 s on average); capability routing sends all to the specialist
        (4 s each), at the price of queueing them all on one worker.
        """),
    code("""
        strategies = ("round_robin", "capability", "balanced")
        cap = {s: simulate(Scenario.load("capability"), s) for s in strategies}
        for name, r in cap.items():
            print(f"{name:<12} mean time per summarisation {r.mean_task_s:g} s"
                  f"   makespan {r.makespan:g} s")
        """),
    code("""
        fig, axes = plt.subplots(len(cap), 1, figsize=(8, 1.6 * len(cap)), sharex=True)
        for ax, (name, r) in zip(axes, cap.items()):
            gantt(ax, r.run, name)
            ax.set_xlim(0, max(x.run.makespan for x in cap.values()) + 2)
        fig.tight_layout()
        plt.show()
        """),
]


# ---------------------------------------------------------------------------------------------
# prompt_eval.ipynb
# ---------------------------------------------------------------------------------------------

PROMPT_EVAL = [
    md("""
        # Measuring a prompt change over many goals

        One example says little about a prompt edit. This notebook measures an edit of the
        decomposition prompt over the goal set shipped for the worked examples
        (`planrun.eval`):

        1. **edit** a copy of `decompose.md` (one sentence added to the dependency rule);
        2. **evaluate** both versions on every goal: the share that ends with an accepted
           plan (shape and contracts), from the first reply or after repair, model calls and
           tokens per accepted plan, problem codes, plan size, cost, and node / link F1
           against each goal's reference plan;
        3. **plot** the two versions' rates side by side;
        4. **compare**: the goals whose outcome or plan changed;
        5. **a stale recording**: an edit the recording has never seen is a `FixtureMiss`,
           not a network call.

        Offline (the default, and in CI) the model's answers are replayed from the shipped
        cassette `planrun/evals/cassettes/examples.json` (synthesized in the API's wire
        format; `python tools/make_fixtures.py --eval --live` re-records it against a real
        key). With `LIVE = True` in the next cell (and `OPENAI_API_KEY` set) the same cells
        talk to the configured endpoint and record to a scratch cassette.
        """),
    code("""
        import difflib
        import io
        import os
        import shutil
        import tempfile
        from pathlib import Path

        import matplotlib

        matplotlib.use("Agg")  # headless (CI); show() below embeds each figure as a PNG
        import matplotlib.pyplot as plt
        from IPython.display import Image, display

        from planrun.dev.eval import evaluate, load_goals, shipped
        from planrun.model import default_prompt_dir
        from planrun.testing import FixtureMiss

        LIVE = False  # True: call the configured endpoint (OPENAI_API_KEY) instead; it costs money
        GOALS, CASSETTE = shipped("examples")
        work = Path(tempfile.mkdtemp(prefix="planrun-eval-"))

        def run_eval(versions):
            if LIVE:
                return evaluate(GOALS, versions, record=work / "live.json")
            return evaluate(GOALS, versions, replay=CASSETTE)

        def show(fig):
            # matplotlib.use("Agg") keeps the notebook headless (CI) but also switches off the
            # inline backend, so plt.show() would display nothing: embed the figure as a PNG.
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
            plt.close(fig)
            display(Image(buffer.getvalue()))

        goals = load_goals(GOALS)
        for goal in goals:
            print(f"{goal.id:<20} {len(goal.reference['tasks'])} tasks  {goal.goal}")
        """),
    md("""
        ## 1. Edit the prompt

        The shipped prompts are copied to a scratch folder, and rule 4 of the copy gets one
        more sentence: check each `depends_on` index before answering. The repository's
        `prompts/` folder is only read.
        """),
    code("""
        edited = work / "edited"
        shutil.copytree(str(default_prompt_dir()), edited)
        template = edited / "decompose.md"
        before = template.read_text(encoding="utf-8")
        rule = "   itself or on a later task.\\n"
        after = before.replace(rule, "   itself or on a later task. Before you answer, check "
                               "every `depends_on` entry: each\\n   index must be smaller than "
                               "its own index.\\n")
        template.write_text(after, encoding="utf-8")
        print("".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                           "shipped/decompose.md", "edited/decompose.md")))
        """),
    md("""
        ## 2. Evaluate both versions

        `evaluate` runs the real decomposer (`planrun.adecompose`, with its repair loop) on
        every goal for every version; the table puts the versions side by side.
        """),
    code("""
        report = run_eval({"shipped": None, "edited": edited})
        print(report.table())
        """),
    md("""
        ## 3. The rates side by side
        """),
    code("""
        summaries = report.summaries()
        metrics = [("accepted first reply", "first_try_accepted_rate"),
                   ("accepted", "accepted_rate"), ("node F1", "node_f1"),
                   ("link F1", "link_f1")]
        fig, (rates, repairs) = plt.subplots(1, 2, figsize=(12, 4),
                                             gridspec_kw={"width_ratios": [3, 1]})
        width = 0.38
        for k, (name, summary) in enumerate(summaries.items()):
            xs = [i + (k - 0.5) * width for i in range(len(metrics))]
            values = [summary[key] or 0.0 for _, key in metrics]
            bars = rates.bar(xs, values, width, label=name)
            rates.bar_label(bars, labels=[f"{v:.0%}" if i < 2 else f"{v:.2f}"
                                          for i, v in enumerate(values)], fontsize=8)
            repairs.bar(k, summary["model_calls_per_accepted"] or 0.0, 0.6, label=name)
        rates.set_xticks(range(len(metrics)), [label for label, _ in metrics])
        rates.set_ylim(0, 1.15)
        rates.set_title(f"{len(goals)} goals: rates per prompt version")
        rates.legend(loc="lower right")
        repairs.set_xticks(range(len(summaries)), list(summaries))
        repairs.set_title("model calls per accepted plan")
        show(fig)
        """),
    md("""
        ## 4. The goals whose plans changed

        `compare` lists every goal whose outcome (`first_try`, `repaired`, `invalid`, `error`)
        or plan differs between two versions, with the repairs and the link F1 of each.
        """),
    code("""
        changed = report.compare("shipped", "edited")
        print(f"{'goal':<20} {'shipped':<10} {'edited':<10} {'plan':<8} {'repairs':<8} link F1")
        for row in changed:
            f1 = row["link_f1"]
            fmt = lambda v: "-" if v is None else f"{v:.2f}"
            print(f"{row['id']:<20} {row['shipped']:<10} {row['edited']:<10} "
                  f"{'changed' if row['plan_changed'] else 'same':<8} "
                  f"{row['repairs']['shipped']} -> {row['repairs']['edited']}   "
                  f"{fmt(f1['shipped'])} -> {fmt(f1['edited'])}")
        """),
    code("""
        first = next(r for r in changed if r["plan_changed"])
        plans = {name: next(o for o in report[name].outcomes if o.id == first["id"]).plan
                 for name in ("shipped", "edited")}
        for name, plan in plans.items():
            edges = [f"{j}->{i}" for i, t in enumerate(plan["tasks"]) for j in t["depends_on"]]
            print(f"{name:<8} {first['id']}: " + ", ".join(
                f"{i}:{t['kind']}" for i, t in enumerate(plan["tasks"])) + f"   edges {edges}")
        """),
    md("""
        ## 5. An edit the recording has never seen

        Offline, every request must have a recording. A further edit changes the request, so
        the replay stops at once with a `FixtureMiss` that names the template and the
        command that re-records the cassette; nothing is sent anywhere.
        """),
    code("""
        again = work / "again"
        shutil.copytree(edited, again)
        (again / "decompose.md").write_text(after + "\\nKeep plans short.\\n", encoding="utf-8")
        if LIVE:
            print("live: the edited prompt is simply sent to the endpoint")
        else:
            try:
                evaluate(GOALS, {"again": again}, replay=CASSETTE)
            except FixtureMiss as miss:
                print(str(miss).splitlines()[0])
            else:
                raise AssertionError("a stale recording must not replay")
        """),
]


BOOKS = {
    "strategies.ipynb": STRATEGIES,
    "decompose_prompt.ipynb": DECOMPOSE_PROMPT,
    "ticket_run.ipynb": TICKET_RUN,
    "prompt_eval.ipynb": PROMPT_EVAL,
}


def build(cells: list[tuple[str, str]], stem: str) -> nbformat.NotebookNode:
    """A notebook of these cells, with no outputs and stable cell ids."""
    notebook = new_notebook()
    notebook.metadata["kernelspec"] = {
        "display_name": "Python 3", "language": "python", "name": "python3",
    }
    for n, (kind, source) in enumerate(cells):
        cell = new_markdown_cell(source) if kind == "markdown" else new_code_cell(source)
        cell["id"] = f"{stem}-{n:02d}"
        notebook.cells.append(cell)
    nbformat.validate(notebook)
    return notebook


def execute(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Run ``notebook`` top to bottom, offline, from a folder outside the repository."""
    from nbclient import NotebookClient

    with tempfile.TemporaryDirectory(prefix="planrun-notebook-") as folder:
        NotebookClient(notebook, timeout=600, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": folder}}).execute()
    notebook.metadata.pop("widgets", None)
    return notebook


# What changes from one run to the next (run ids, durations, scratch folders, addresses),
# after the path of the checkout is masked (the stored outputs were made in another one).
_VOLATILE = [
    (re.compile(r"\b[0-9a-f]{12}\b"), "<id>"),
    (re.compile(r"\d+\.\d+ ?(s|ms|us)\b"), "<time>"),
    (re.compile(r"/tmp/[^\s'\"]+"), "<tmp>"),
    (re.compile(r"0x[0-9a-f]+"), "<addr>"),
]


_CHECKOUT = re.compile(r"/[^\s'\"()]+/(fixtures|prompts|src|notebooks)/")
"""A path into a checkout (the one the notebook was stored from, or this one)."""

VARIES = "vary from run to run"
"""A code cell whose source says this prints timings: its text is not compared."""


def outputs(notebook: nbformat.NotebookNode) -> list[list[str]]:
    """Each code cell's outputs as text, with what varies between runs masked.

    A figure counts by its kind (``image/png``), not its bytes. Consecutive pieces of one
    stream count as one: a kernel splits what a cell prints as its timing goes."""
    cells = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        shown = []
        varies = VARIES in cell.source
        for out in _joined_streams(cell.get("outputs", [])):
            if out.get("output_type") == "stream":
                text = out.get("text", "")
            elif out.get("output_type") == "error":
                text = f"error: {out.get('ename')}: {out.get('evalue')}"
            else:
                data = out.get("data", {})
                text = "image/png" if "image/png" in data else str(data.get("text/plain", ""))
            if varies and out.get("output_type") == "stream":
                text = "<varies>"
            text = _CHECKOUT.sub(r"<repo>/\1/", text.replace(str(REPO), "<repo>"))
            for pattern, mask in _VOLATILE:
                text = pattern.sub(mask, text)
            shown.append(text)
        cells.append(shown)
    return cells


def _joined_streams(outs: list[Any]) -> list[Any]:
    """``outs`` with each run of pieces of the same stream joined into one."""
    joined: list[Any] = []
    for out in outs:
        last = joined[-1] if joined else None
        if (out.get("output_type") == "stream" and last is not None
                and last.get("output_type") == "stream" and last.get("name") == out.get("name")):
            joined[-1] = {**last, "text": last.get("text", "") + out.get("text", "")}
        else:
            joined.append(out)
    return joined


def sources(notebook: nbformat.NotebookNode) -> list[tuple[str, str, str]]:
    """(id, type, source) of every cell: what --check compares."""
    return [(c.get("id", ""), c.cell_type, c.source) for c in notebook.cells]


def problems(name: str) -> list[str]:
    """Why the stored notebook ``name`` is not what its source here makes (empty: it is)."""
    target = NOTEBOOKS / name
    if not target.is_file():
        return [f"{name}: missing"]
    stored = nbformat.read(target, as_version=4)
    stem = name.removesuffix(".ipynb").replace("_", "-")
    found = []
    if sources(stored) != sources(build(BOOKS[name], stem)):
        found.append(f"{name}: its cells differ from their source in tools/make_notebooks.py")
    unrun = [c.get("id") for c in stored.cells if c.cell_type == "code"
             and c.get("execution_count") is None]
    if unrun:
        found.append(f"{name}: stored without the outputs of {', '.join(unrun)}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME.ipynb",
                        help="the notebooks to write (default: all)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a notebook differs from its source "
                        "here or was stored without its outputs")
    args = parser.parse_args(argv)
    names = args.names or list(BOOKS)
    unknown = [n for n in names if n not in BOOKS]
    if unknown:
        parser.error(f"no notebook {', '.join(unknown)} (have {', '.join(BOOKS)})")
    if args.check:
        found = [p for name in names for p in problems(name)]
        for line in found:
            print(line, file=sys.stderr)
        if found:
            print("run python tools/make_notebooks.py to write and run them", file=sys.stderr)
        return 1 if found else 0
    for name in names:
        stem = name.removesuffix(".ipynb").replace("_", "-")
        notebook = execute(build(BOOKS[name], stem))
        target = NOTEBOOKS / name
        target.write_text(nbformat.writes(notebook) + "\n", encoding="utf-8")
        print(f"wrote {target.relative_to(REPO)} (run, with its outputs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
