"""services/logging.py: a command that draws on the terminal while services run in its process
(`gavel simulate`'s progress bar) sends their events to a file for the while, and then back."""

from __future__ import annotations

import io
import json
import logging

import structlog

from common.config import LogSettings
from services.logging import configure_logging, logging_into


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
