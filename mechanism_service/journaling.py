"""The mechanism's journal (common/journal.py underneath): accepted inputs appended before their
ack and committed in groups, each start's epoch, a snapshot at the boundaries that need one, the
audit trail's records, and the replay of what came after the last snapshot. Without a journal
(``--no-journal``, the simulator's plain runs) every call is a no-op and nothing is durable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from common.bus import Delivery
from common.codec import DEFAULT_CODEC
from common.journal import Journal, wire_bytes
from common.messages import Assignment
from common.messages.base import Message
from mechanism_service.core import audit
from mechanism_service.core.memory import Memory

# At most this many inputs replayed after a restart (~0.15 s), plus a round's: a boundary that
# only admitted jobs skips its snapshot, but not more often than this in a row.
SNAPSHOT_EVERY_EVENTS = 20_000


class MechanismJournal:
    def __init__(self, journal: Journal | None, *, source: str) -> None:
        self.file = journal  # None: no journal
        self._source = source  # the sender named on the decisions the mechanism journals
        self._commit_waiter: asyncio.Future[None] | None = None
        self.snapshot_every_events = SNAPSHOT_EVERY_EVENTS
        self._snapshot_seq = 0  # the last event the loaded snapshot includes

    @property
    def kept(self) -> bool:
        return self.file is not None

    # -- inputs -----------------------------------------------------------------------------------

    def record(self, kind: str, d: Delivery, at_s: float | None = None, message: Message | None = None) -> None:
        """Journal an accepted input as it came (``message``: as the mechanism completed it)."""
        if self.file is not None:
            body = wire_bytes(d) if message is None else DEFAULT_CODEC.encode(
                message, source=d.envelope.source, sent_at_s=d.envelope.sent_at_s, message_id=d.envelope.message_id,
            )
            self.file.append(kind, body, at_s)

    def record_decision(self, kind: str, message: Message, now_s: float) -> None:
        """A decision of the mechanism's own that a replay must apply, never make again (it
        depended on time: a worker declared lost)."""
        if self.file is not None:
            self.file.append(kind, DEFAULT_CODEC.encode(message, source=self._source, sent_at_s=now_s), now_s)

    def record_end(self, record: audit.EndRecord) -> None:
        """A job's end in the audit trail, committed with the next commit (a boundary's, or its
        handler's)."""
        if self.file is not None:
            self.file.append(audit.ENDED, audit.encode_end(record), record.at_s)

    async def durable(self) -> None:
        """Return once what was recorded is committed (one commit for every handler waiting)."""
        if self.file is None or not self.file.pending:
            return
        if self._commit_waiter is None:
            loop = asyncio.get_running_loop()
            self._commit_waiter = loop.create_future()
            loop.call_soon(self._commit)
        await asyncio.shield(self._commit_waiter)

    def _commit(self) -> None:
        waiter, self._commit_waiter = self._commit_waiter, None
        assert waiter is not None and self.file is not None
        try:
            self.file.commit()
        except Exception as e:  # noqa: BLE001 - every waiting handler fails, so nothing is acked
            waiter.set_exception(e)
        else:
            waiter.set_result(None)

    def begin_epoch(self, epoch: int, now_s: float) -> None:
        """A new incarnation's epoch, journaled at once: a second restart before the next
        snapshot must not reuse it."""
        if self.file is not None:
            self.file.append("epoch", str(epoch).encode(), now_s)
            self.file.commit()

    # -- boundaries -------------------------------------------------------------------------------

    def write_boundary(
        self, memory: Memory, commands: Sequence[Message], now_s: float, *, changed: bool,
        record: Callable[[], audit.BoundaryRecord], assignments: Sequence[Assignment], settled: list[list[object]],
    ) -> None:
        """Write ahead: the boundary's whole memory, its commands encoded in it (a restart
        republishes them), with its audit record, before any command goes out. ``changed``: it
        settled, re-solved or dispatched (or the last one did): a boundary that only admitted
        jobs skips the snapshot (replaying the submissions admits them again, in order: pickling
        the whole memory per arrival would make ingest quadratic), but not so often that a
        restart replays without end."""
        if self.file is None:
            return  # encoded only for a journal: without one, this was a fifth of the simulator's time
        had_commands = bool(memory.commands)
        memory.commands = [DEFAULT_CODEC.encode(c, source=self._source, sent_at_s=now_s) for c in commands]
        if changed or had_commands or self._replay_too_long():
            self.file.append(audit.BOUNDARY, audit.encode_boundary_columns(record(), assignments, settled), now_s)
            self.file.save_snapshot(memory)  # commits the record with it

    def _replay_too_long(self) -> bool:
        assert self.file is not None
        return self.file.last_seq() - self.file.snapshot_seq >= self.snapshot_every_events

    # -- recovery ---------------------------------------------------------------------------------

    def load(self) -> Memory | None:
        """The last snapshot's memory (None: a new journal)."""
        if self.file is None:
            return None
        memory, self._snapshot_seq = self.file.load_snapshot()
        return memory

    def replay(
        self, memory: Memory, appliers: Mapping[str, Callable[[Message, float | None, bytes], float | None]]
    ) -> tuple[int, float]:
        """Apply the inputs accepted after the snapshot, in order, each by its kind's applier
        (which returns the mechanism time it happened at, when it says one). The epochs are
        counted, the audit records skipped (outputs, for the checker). Returns how many events
        were read, and the latest time: the memory's, or an applier's."""
        assert self.file is not None
        replayed = 0
        latest_s = memory.now_s
        for _, kind, body, at_s in self.file.events(after_seq=self._snapshot_seq):
            replayed += 1
            if kind == "epoch":  # a start since the snapshot: the next one is after it
                memory.epoch = max(memory.epoch, int(body))
                continue
            if kind in audit.AUDIT_KINDS:
                continue
            apply = appliers.get(kind)
            if apply is not None:
                happened_s = apply(DEFAULT_CODEC.decode(body).message, at_s, body)
                if happened_s is not None:
                    latest_s = max(latest_s, happened_s)
        return replayed, latest_s

    def close(self, *, crashed: bool) -> None:
        """A round loop that crashed part way through a boundary leaves nothing of it, as a
        killed process would not (a restart re-does the boundary from the journal)."""
        if self.file is None:
            return
        if crashed:
            self.file.abandon()
        else:
            self.file.close()
