"""Development tools: recorded fixtures and replay, testing helpers, simulation in virtual
time, the second article's experiments (:mod:`planrun.dev.compare`), prompt evaluation,
TaskBench and the demo.

Each tool is a module of its own, imported by name: :mod:`planrun.dev.eval` (``evaluate``,
``aevaluate``, ``EvalReport``), :mod:`planrun.dev.sim` (``simulate``, ``Scenario``,
``SimResult``), ... What a user's tests import (replay, record, the test doubles) is
:mod:`planrun.testing`. Nothing in the core or the runtime imports these modules.
"""
