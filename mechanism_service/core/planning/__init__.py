"""One round's decisions, as pure functions of the state (docs/gavel-semantics.md sections 5-6),
one module a step, in the order a round runs them (core/rounds.py, ``open_round``):

1. holds.py: last round's entries that keep their GPUs because a move has not paid for itself
   yet (their definitions: migration.held_entries, migration.fit_held);
2. priority.py: per type, each entry's allocation / share of the type's time it received, and
   the moves' charges (their definitions: ``priority_rows`` there, migration.charge_moves);
3. picking.py: a greedy pass over the per-type queues, fastest type first, gangs whole;
4. placement.py: concrete workers per picked entry, keeping a continuing entry on its GPUs.

Each step has a row form, the definition, written plainly over the entries, and the fast forms
the rounds run: columnar (one numpy operation a type over the ledgers' columns, model.Ledgers)
and, below ledger_reads.SMALL_ROWS rows, on Python lists (ledger_reads.ledger_lists: the time
received read each round; what only a change of the ledgers moves, the lists of the allocation,
the deficits and the rates and each type's candidate cells, kept in them until then:
model.Ledgers.derived). A step module keeps its row form beside its fast forms, so the
definition and what is held to it read together; the holds' and the charges' row forms stay in
migration.py, where what a move costs is decided (docs/mechanism.md, "What a move costs"), and
their fast forms here name them. tests/unit/mechanism/test_planning_fast.py,
test_planning_lists.py and test_boundary_fast.py hold every fast form to its row form, exactly:
the schedule must not change by a bit.
"""
