"""A DBOS log record carrying a traceback is shortened to one line by a worker process."""

from __future__ import annotations

import logging
import traceback

from planrun.runtime._dbos_worker import OneLineTracebacks


def _record(msg: str, exc: BaseException | None = None) -> logging.LogRecord:
    info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("dbos", logging.WARNING, __file__, 1, msg, None, info)


def _failure() -> ConnectionError:
    try:
        raise ConnectionError("server closed the connection unexpectedly\nmore detail")
    except ConnectionError as exc:
        return exc


def test_a_traceback_in_the_message_becomes_its_last_line() -> None:
    exc = _failure()
    text = "".join(traceback.format_exception(exc))
    record = _record(f"Exception polling schedules: {text}")
    assert OneLineTracebacks().filter(record)
    assert record.getMessage() == "Exception polling schedules: more detail"


def test_an_attached_exception_becomes_one_line_of_the_message() -> None:
    record = _record("queue thread failed", _failure())
    OneLineTracebacks().filter(record)
    formatted = logging.Formatter().format(record)
    assert formatted == ("queue thread failed: ConnectionError: "
                         "server closed the connection unexpectedly")
    assert "\n" not in formatted


def test_a_plain_message_is_left_as_it_is_and_the_filter_is_installed_once() -> None:
    record = _record("retrying")
    OneLineTracebacks().filter(record)
    assert record.getMessage() == "retrying"
    logger = logging.getLogger("dbos")
    before = len(logger.filters)
    OneLineTracebacks.install()
    OneLineTracebacks.install()
    assert len(logger.filters) - before <= 1
    assert sum(isinstance(f, OneLineTracebacks) for f in logger.filters) == 1
