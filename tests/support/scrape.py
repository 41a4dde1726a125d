"""A metrics endpoint read as Prometheus reads it: the text format parsed with prometheus_client's
own parser, every sample by its name and labels."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample: (name, its labels) -> value. A text the parser refuses raises."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every sample of ``name`` whose labels include ``labels`` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def scrape(url: str, timeout_s: float = 10.0) -> Samples:
    """GET the endpoint (blocking: from a test's thread, or via ``ascrape`` on a loop)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - a local endpoint
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(response.read().decode())


async def ascrape(url: str) -> Samples:
    """``scrape`` from a coroutine, in a thread: the endpoint runs on this loop and must answer."""
    return await asyncio.to_thread(scrape, url)
