"""Who owns a job, and who may cancel it (issue 23: any user could cancel any job).

A job's owner is who submitted it. The broker says which broker user published a message (its
validated user-id: RabbitMQ refuses a user-id that is not the publishing connection's), so where
the broker gives each person a user of their own, that user is the owner. Where people share a
broker user (``guest`` on a laptop, ``gavel-cli`` in the compose deployment: ``shared_broker_users``),
the owner is the operating-system user the client says it runs as: honest clients cannot cancel
each other's jobs by mistake, but the name is the client's word, not the broker's (docs/deploy.md,
"Who owns a job").

A cancel is allowed to the owner and to the operators (``operators``: owners' names, as above);
a job with no owner (submitted before owners were recorded, or by the simulator) to anyone. An
owner the broker vouches for (a person's own broker user) is only ever matched by a requester the
broker vouches for: a name claimed through a shared broker user cannot stand in for it.
"""

from __future__ import annotations

from dataclasses import dataclass

SHARED_BROKER_USERS = frozenset({"guest", "gavel-cli"})


@dataclass(frozen=True, slots=True)
class Owner:
    name: str
    verified: bool = False  # the broker vouches for the name (a person's own broker user)


@dataclass(frozen=True, slots=True)
class Ownership:
    operators: frozenset[str] = frozenset()
    shared_broker_users: frozenset[str] = SHARED_BROKER_USERS


def unverified(claimed_broker_user: str, validated_user: str) -> str:
    """Why a message's broker user cannot be believed ("" when it can): it must be the one the
    broker validated. A message that names none is taken as the validated user's."""
    if not claimed_broker_user or claimed_broker_user == validated_user:
        return ""
    if not validated_user:
        return f"it says it was sent by broker user {claimed_broker_user!r}, and the broker did not say so"
    return f"it says it was sent by broker user {claimed_broker_user!r}, and the broker says {validated_user!r} sent it"


def owner(os_user: str, broker_user: str, rule: Ownership) -> Owner:
    """The broker user when it is a person's own (verified), else the OS user the client names."""
    if broker_user and broker_user not in rule.shared_broker_users:
        return Owner(broker_user, verified=True)
    return Owner(os_user)


def may_cancel(job_owner: Owner | None, requester: Owner, rule: Ownership) -> bool:
    if job_owner is None or not job_owner.name:
        return True
    if job_owner.verified and not requester.verified:
        return False
    return requester.name == job_owner.name or requester.name in rule.operators


def refusal(job_id: str, job_owner: Owner, requester: Owner) -> str:
    who = requester.name or "a user who gave no name"
    how = "" if requester.verified or not job_owner.verified else f" through a shared broker user"
    return (
        f"job {job_id!r} belongs to {job_owner.name!r}; {who!r}{how} may not cancel it (its owner may, and the "
        "operators: gavel serve mechanism --operators)"
    )
