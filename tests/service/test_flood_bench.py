"""bench/flood.py, small (issue 13): 3,000 jobs against a bound of 100 while the services run as
processes. Whatever the broker took and refused (that depends on how fast the mechanism takes
them in: its prefetch of 512 comes on top of the bound), every job is either accepted or named as
not accepted, the mechanism's answer and its journal hold exactly the accepted, no service died,
and the bench leaves nothing on the broker. ~15 s on 2 shared cores."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import aio_pika
import aiormq
import pytest

from tests.support.processes import ROOT


async def exchange_exists(url: str, name: str) -> bool:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        try:
            await channel.declare_exchange(name, passive=True)
            return True
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
    finally:
        await connection.close()


@pytest.mark.slow  # ~15-25 s: bench/flood.py with the services as processes
def test_a_small_flood_accounts_for_every_job_and_cleans_up(broker_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "bench/flood.py", "--jobs", "3000", "--max-length", "100", "--json", "--amqp", broker_url],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["accepted"] + report["not_accepted"] == 3000
    assert report["journal_is_exactly_the_accepted"] and report["journal_submitted_events"] == report["accepted"]
    answer = report["mechanism_answer"]
    assert (answer["new"], answer["known"], answer["refused"], answer["sealed"]) == (report["accepted"], 0, 0, True)
    assert report["cli_exit_code"] == (1 if report["not_accepted"] else 0)
    if report["not_accepted"]:
        assert report["reason"].startswith("the mechanism's submissions queue is full (at most 100 waiting")
    assert report["services_died_during_the_flood"] == []
    assert set(report["peak_rss_mib"]) >= {"mechanism", "policy", "estimator", "fleet"}
    assert all(mib > 0 for mib in report["peak_rss_mib"].values())
    assert not asyncio.run(exchange_exists(broker_url, report["exchange"]))
    assert "flood: submitting 3,000 jobs" in done.stderr  # progress on stderr, the report alone on stdout


pytestmark = pytest.mark.broker
