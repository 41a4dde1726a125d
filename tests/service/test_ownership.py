"""A job records who submitted it, `gavel jobs` shows it, and only its owner or an operator may
cancel it (issue 23), on the in-memory bus whose connections log in as broker users, as
RabbitMQ's do (Delivery.user_id); the owner survives a restart from the journal."""

from __future__ import annotations

import pathlib

from common.messages import CancelJob, JobSpec, JobSubmitted
from common.transport.memory import InMemoryBus
from mechanism_service.core.ownership import Ownership
from services.cli.replies import Replies
from services.cli.status_cmd import ask_on
from tests.support.world import RESNET, World, kill, world

RULE = Ownership(operators=frozenset({"ops"}))


async def as_user(w: World, user: str) -> InMemoryBus:
    bus = InMemoryBus(w.bus.broker, source=f"cli-{user}", user=user)
    await bus.start()
    return bus


async def cancel(bus: InMemoryBus, job_id: str, requested_by: str, broker_user: str | None = None) -> dict[str, object]:
    async with Replies(bus) as replies:
        message = CancelJob(job_id, "no longer needed", replies.key, f"r-{job_id}-{requested_by}", requested_by, bus.user if broker_user is None else broker_user)
        await bus.publish(message)
        return await replies.wait(message.request_id, 10.0)  # type: ignore[return-value]


def owners(rows: object) -> dict[str, str]:
    return {str(r["id"]): str(r.get("owner", "")) for r in rows}  # type: ignore[attr-defined, union-attr]


async def test_only_the_owner_or_an_operator_may_cancel_and_the_owner_is_kept(tmp_path: pathlib.Path) -> None:
    journal = tmp_path / "journal.sqlite"
    w = await world(journal, owners=RULE)
    await w.worker("a", "v100")
    alice, bob, shared, ops = await as_user(w, "alice"), await as_user(w, "bob"), await as_user(w, "guest"), await as_user(w, "ops")
    await alice.publish(JobSubmitted(JobSpec("hers", RESNET, 10**6), submitted_by="al", broker_user="alice"))
    await shared.publish(JobSubmitted(JobSpec("carols", RESNET, 10**6), submitted_by="carol", broker_user="guest"))
    await shared.publish(JobSubmitted(JobSpec("mallorys", RESNET, 10**6), submitted_by="carol", broker_user="alice"))
    await w.bus.drain()

    rows = await ask_on(w.bus, "jobs", timeout_s=10)
    # a person's own broker user names the owner; a shared one (guest) leaves it to the OS user
    assert owners(rows) == {"hers": "alice", "carols": "carol", "mallorys": ""}
    forged = next(r for r in rows if r["id"] == "mallorys")  # type: ignore[union-attr]
    assert forged["state"] == "rejected" and "the broker says 'guest' sent it" in str(forged["reason"])  # type: ignore[index]

    refused = await cancel(bob, "hers", "bob")
    assert refused == {"error": "job 'hers' belongs to 'alice'; 'bob' may not cancel it (its owner may, and the operators: gavel serve mechanism --operators)"}
    # a name claimed through a shared broker user never stands in for a broker user's own
    assert "'alice' through a shared broker user may not" in str((await cancel(shared, "hers", "alice"))["error"])
    assert (await cancel(shared, "hers", "ops")).get("error")
    assert "the broker says 'guest' sent it" in str((await cancel(shared, "carols", "carol", broker_user="bob"))["error"])
    assert (await cancel(shared, "carols", "dave")).get("error")
    assert (await cancel(shared, "carols", "carol"))["state"] == "cancelling"  # its owner
    assert (await cancel(ops, "hers", "root"))["state"] == "cancelling"  # an operator, as the broker says

    await kill(w)  # and again from the journal: the owners were journaled with the jobs
    w2 = await world(journal, clock=w.clock, owners=RULE)
    assert owners(await ask_on(w2.bus, "jobs", timeout_s=10)) == {"hers": "alice", "carols": "carol", "mallorys": ""}
    await w2.mechanism.stop()


async def test_a_job_from_a_client_that_names_no_broker_user_is_owned_by_the_validated_one(tmp_path: pathlib.Path) -> None:
    journal = tmp_path / "journal.sqlite"
    w = await world(journal, owners=RULE)
    alice = await as_user(w, "alice")
    await alice.publish(JobSubmitted(JobSpec("old-client", RESNET, 10**6)))  # no submitted_by, no broker_user
    await w.bus.drain()
    assert owners(await ask_on(w.bus, "jobs", timeout_s=10)) == {"old-client": "alice"}
    await kill(w)
    w2 = await world(journal, clock=w.clock, owners=RULE)  # the journal kept what the broker said
    assert owners(await ask_on(w2.bus, "jobs", timeout_s=10)) == {"old-client": "alice"}
    await w2.mechanism.stop()
