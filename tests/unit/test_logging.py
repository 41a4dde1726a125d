"""common/log.py: a command that draws on the terminal while services run in its process
(`gavel simulate`'s progress bar) sends their events to a file for the while, and then back."""

from __future__ import annotations

import io
import json
import logging

import structlog

from common.config import LogSettings
from common.log import OrdinaryReconnect, configure_logging, logging_into


def test_every_event_of_the_block_goes_to_the_file_counted_by_level_and_then_back_to_the_stream(tmp_path):
    stream = io.StringIO()
    configure_logging(LogSettings(level="info", format="json"), stream=stream, force=True)
    log = structlog.get_logger("gavel.test")
    with logging_into(tmp_path / "run.log") as log_file:
        log.info("inside", n=1)
        log.error("crashed", exc_info=ValueError("injected"))
        logging.getLogger("aiormq").error("a library's own")
        log.debug("below the level")
    log.warning("after")

    events = [json.loads(line) for line in (tmp_path / "run.log").read_text().splitlines()]
    assert [(e["event"], e["level"]) for e in events] == [("inside", "info"), ("crashed", "error"), ("a library's own", "error")]
    assert log_file.by_level == {"info": 1, "error": 2}
    assert log_file.summary() == "2 errors, 1 info"
    assert [json.loads(line)["event"] for line in stream.getvalue().splitlines()] == ["after"]


def test_a_block_that_logged_nothing_leaves_no_file(tmp_path):
    configure_logging(LogSettings(level="warning"), stream=io.StringIO(), force=True)
    with logging_into(tmp_path / "run.log") as log_file:
        structlog.get_logger("gavel.test").info("below the level")
    assert log_file.by_level == {} and not (tmp_path / "run.log").exists()


def library_record(name: str, level: int, msg: str, args: tuple = (), exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(name, level, __file__, 1, msg, args, exc_info)


def test_the_client_librarys_account_of_a_reconnect_is_debug_and_its_other_errors_stay_as_they_are():
    import aiormq.exceptions

    closed = aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED - test")
    noise = [
        library_record("aiormq.connection", logging.ERROR, 'Unexpected connection close from remote "%s", ...', ("url",)),
        library_record("aiormq.connection", logging.WARNING, "Cancelling cause reader exited abnormally", exc=closed),
        library_record("aio_pika.tools", logging.ERROR, "Callback %r error: %s: %s",
                       ("cb", "ChannelInvalidStateError", aiormq.exceptions.ChannelInvalidStateError("No active transport"))),
        library_record("aio_pika.robust_connection", logging.WARNING, 'Connection attempt to "%s" failed: %s. ...', ("u", "e")),
    ]
    kept = [
        library_record("aio_pika.tools", logging.ERROR, "Callback %r error: %s: %s", ("cb", "ValueError", ValueError("ours"))),
        library_record("aiormq.connection", logging.WARNING, "Cancelling cause reader exited abnormally", exc=ValueError("bad frame")),
        library_record("aiormq.channel", logging.ERROR, "Consumer callback failed", exc=closed),
        library_record("gavel.bus.rabbit", logging.WARNING, "Unexpected connection close from remote"),
    ]
    quiet, debug = OrdinaryReconnect(show=False), OrdinaryReconnect(show=True)
    assert [quiet.filter(r) for r in noise] == [False] * len(noise)
    assert [debug.filter(r) for r in noise] == [True] * len(noise)
    assert {(r.levelno, r.levelname) for r in noise} == {(logging.DEBUG, "DEBUG")}
    levels = [r.levelno for r in kept]
    assert [quiet.filter(r) for r in kept] == [True] * len(kept) and [r.levelno for r in kept] == levels
