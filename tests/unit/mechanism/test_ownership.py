"""Who owns a job and who may cancel it (issue 23: any user could cancel any job)."""

from __future__ import annotations

from mechanism_service.core.ownership import Owner, Ownership, may_cancel, owner, refusal, unverified

RULE = Ownership(operators=frozenset({"ops"}))


def test_the_owner_is_the_broker_user_unless_people_share_it() -> None:
    assert owner("alice", "alice-broker", RULE) == Owner("alice-broker", verified=True)  # a broker user of one's own
    assert owner("alice", "guest", RULE) == Owner("alice")  # shared: the OS user the client names
    assert owner("alice", "gavel-cli", RULE) == Owner("alice")
    assert owner("alice", "", RULE) == Owner("alice")  # the in-memory bus names none
    assert owner("", "", RULE) == Owner("")


def test_a_broker_user_must_be_the_one_the_broker_validated() -> None:
    assert unverified("alice", "alice") == ""
    assert unverified("", "alice") == ""  # a client that did not say: the broker's word is taken
    assert unverified("alice", "") == "it says it was sent by broker user 'alice', and the broker did not say so"
    assert unverified("alice", "bob") == "it says it was sent by broker user 'alice', and the broker says 'bob' sent it"


def test_only_the_owner_and_operators_may_cancel() -> None:
    alice, bob, ops = Owner("alice"), Owner("bob"), Owner("ops")
    assert may_cancel(alice, alice, RULE)
    assert may_cancel(alice, ops, RULE)
    assert not may_cancel(alice, bob, RULE)
    assert not may_cancel(alice, Owner(""), RULE)
    assert may_cancel(None, bob, RULE) and may_cancel(Owner(""), bob, RULE)  # a job from before owners were recorded
    assert refusal("j", alice, Owner("")) == (
        "job 'j' belongs to 'alice'; 'a user who gave no name' may not cancel it (its owner may, and the operators: "
        "gavel serve mechanism --operators)"
    )


def test_an_owner_the_broker_vouches_for_is_matched_only_by_one_it_vouches_for() -> None:
    alice = Owner("alice", verified=True)
    assert may_cancel(alice, Owner("alice", verified=True), RULE)
    assert may_cancel(alice, Owner("ops", verified=True), RULE)
    assert not may_cancel(alice, Owner("alice"), RULE)  # "alice" claimed through a shared broker user
    assert not may_cancel(alice, Owner("ops"), RULE)
    assert "'alice' through a shared broker user may not cancel it" in refusal("j", alice, Owner("alice"))
