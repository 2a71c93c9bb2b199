"""Development tools: recorded fixtures and replay, testing helpers and the pytest plugin,
simulation in virtual time, the second article's experiments (:mod:`planrun.dev.compare`),
prompt evaluation, TaskBench and the demo.

Each tool is a module of its own; nothing in the core or the runtime imports them.
"""
