"""A service's durable journal: SQLite in WAL mode (docs/ARCHITECTURE.md, "Services as processes").
The mechanism keeps one (its inputs and its memory), and so does the estimator (what it learned
from: submissions, progress, job ends; and its model). ``label`` names whose it is in errors.

Two tables:
- ``events``: every input the mechanism accepted (a worker registered, a job submitted, a lease's
  progress, an allocation), as the wire bytes it arrived in, with the mechanism's time of
  acceptance (``at_s``: a live job's arrival), appended *before* the message is acknowledged.
  Also the mechanism's own inputs that a replay must not decide again: ``epoch`` (a start; the
  body is the epoch as ASCII digits) and ``lost`` (a worker declared lost, which depends on time;
  the body is the WorkerFenced it was told). Append-only: it is also the audit trail the fault
  tests check invariants on.
- ``snapshot``: one row, the mechanism's whole memory at a round boundary (pickled: a local file
  the mechanism itself wrote), written *before* the boundary's commands are published, with the
  last event it includes. Boundaries that only admit jobs (a trace arriving) skip it: replaying
  their submissions admits the same jobs in the same order.

A restarted mechanism loads the snapshot, replays the events after it through the same
handlers, re-publishes the commands of the boundary it was in (same lease ids: workers and the
mechanism both absorb duplicates) and carries on.

Durability: commits survive a killed process (WAL with synchronous=NORMAL); ``sync="full"``
also survives power loss. Appends open a transaction that ``commit`` closes, so a burst of inputs
(a trace being submitted) is written in one commit: group commit, the caller acknowledging the
messages only after it.

Opening checks the file before anything is written: a directory, a file that is not SQLite, or
another application's database (which must not gain our tables) is a ``JournalError`` naming the
file, as is a directory that cannot be made.
"""

from __future__ import annotations

import gc
import pathlib
import pickle
import sqlite3
from collections.abc import Iterator
from typing import Any

from common.bus import Delivery
from common.codec import DEFAULT_CODEC
from common.errors import JournalError

# What a journal holds; a database with other tables and not these is another application's.
TABLES = {"events": {"seq", "kind", "body"}, "snapshot": {"id", "last_seq", "body"}}


class Journal:
    def __init__(
        self, path: str | pathlib.Path, *, sync: str = "normal", label: str = "mechanism journal", cluster: str = ""
    ) -> None:
        if sync not in ("normal", "full"):
            raise ValueError(f"journal sync must be normal or full, got {sync!r}")
        self.path = pathlib.Path(path)
        self._db = _open(self.path)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")  # the first read: a file that is not SQLite fails here
            _check_tables(self.path, self._db, label)
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise JournalError(_reason(self.path, e)) from None
        except JournalError:
            self._db.close()
            raise
        self._db.execute(f"PRAGMA synchronous={sync.upper()}")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, body BLOB NOT NULL, at_s REAL)"
        )
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS snapshot (id INTEGER PRIMARY KEY CHECK (id = 1), last_seq INTEGER NOT NULL, body BLOB NOT NULL)"
        )
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(events)")}
        if "at_s" not in columns:  # a journal written before arrival stamps were kept
            self._db.execute("ALTER TABLE events ADD COLUMN at_s REAL")
        self._claim(label)
        if cluster:
            self._belongs_to(cluster)
        self._in_transaction = False
        self.snapshot_seq = self._snapshot_seq()

    def _claim(self, label: str) -> None:
        """Whose journal this is: a file kept by another service (same tables, other meaning) is
        refused. A journal written before owners were recorded was the mechanism's."""
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        row = self._db.execute("SELECT value FROM meta WHERE key = 'owner'").fetchone()
        if row is None:
            had_events = self._db.execute("SELECT 1 FROM events LIMIT 1").fetchone() is not None
            owner = "mechanism journal" if had_events else label
            self._db.execute("INSERT INTO meta (key, value) VALUES ('owner', ?)", (owner,))
        else:
            owner = row[0]
        if owner != label:
            self._db.close()
            raise JournalError(f"{self.path} is a {owner}, not a {label}: give each service its own file")

    def _belongs_to(self, cluster: str) -> None:
        """Which cluster this is the journal of (services/cli/state_paths.py): recorded at the first
        open that names one (a journal from before that is adopted), refused to any other."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'cluster'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta (key, value) VALUES ('cluster', ?)", (cluster,))
        elif row[0] != cluster:
            self._db.close()
            raise JournalError(
                f"{self.path} is the journal of another cluster ({row[0]}; this one is {cluster}): give each cluster "
                "its own file"
            )

    def append(self, kind: str, body: bytes, at_s: float | None = None) -> int:
        """Add an event to the open transaction (durable once ``commit`` returns)."""
        if not self._in_transaction:
            self._db.execute("BEGIN")
            self._in_transaction = True
        cursor = self._db.execute("INSERT INTO events (kind, body, at_s) VALUES (?, ?, ?)", (kind, body, at_s))
        return int(cursor.lastrowid or 0)

    @property
    def pending(self) -> bool:
        """Appended events not yet committed."""
        return self._in_transaction

    def commit(self) -> None:
        if self._in_transaction:
            self._db.execute("COMMIT")
            self._in_transaction = False

    def last_seq(self) -> int:
        row = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()
        return int(row[0])

    def save_snapshot(self, memory: Any) -> None:
        """Replace the snapshot and commit it, with every event appended before it."""
        body = pickle.dumps(memory, protocol=pickle.HIGHEST_PROTOCOL)
        if not self._in_transaction:
            self._db.execute("BEGIN")
            self._in_transaction = True
        last_seq = self.last_seq()
        self._db.execute(
            "INSERT INTO snapshot (id, last_seq, body) VALUES (1, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET last_seq = excluded.last_seq, body = excluded.body",
            (last_seq, body),
        )
        self.commit()
        self.snapshot_seq = last_seq

    def _snapshot_seq(self) -> int:
        row = self._db.execute("SELECT last_seq FROM snapshot WHERE id = 1").fetchone()
        return 0 if row is None else int(row[0])

    def load_snapshot(self) -> tuple[Any | None, int]:
        """(memory, the last event it includes) or (None, 0) for a new journal."""
        row = self._db.execute("SELECT last_seq, body FROM snapshot WHERE id = 1").fetchone()
        if row is None:
            return None, 0
        # Without the cyclic collector while the objects are made: it would walk the growing
        # heap again and again (a 10 MB memory of 20,000 jobs loads in ~0.17 s instead of ~0.7 s)
        collecting = gc.isenabled()
        gc.disable()
        try:
            return pickle.loads(row[1]), int(row[0])  # noqa: S301 - our own file, written by us
        finally:
            if collecting:
                gc.enable()

    def events(self, after_seq: int = 0, kind: str | None = None) -> Iterator[tuple[int, str, bytes, float | None]]:
        """(seq, kind, body, at_s) in order."""
        query = "SELECT seq, kind, body, at_s FROM events WHERE seq > ?"
        params: tuple[Any, ...] = (after_seq,)
        if kind is not None:
            query += " AND kind = ?"
            params += (kind,)
        yield from self._db.execute(query + " ORDER BY seq", params)

    def close(self) -> None:
        self.commit()
        self._db.close()

    def abandon(self) -> None:
        """Close without committing what was appended since the last commit, as a killed
        process would leave it: the owner crashed part way through a change."""
        if self._in_transaction:
            self._db.execute("ROLLBACK")
            self._in_transaction = False
        self._db.close()


def read_events(path: str | pathlib.Path, *, label: str = "mechanism journal") -> Iterator[tuple[int, str, bytes, float | None]]:
    """A journal's events (seq, kind, body, at_s), in order, read-only: a checker may read the
    journal of a running mechanism, and must never create, upgrade or claim one. A file that is
    missing, not SQLite or another service's is a ``JournalError`` naming it."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise JournalError(f"{path} is a directory; name the journal's file")
    if not path.exists():
        raise JournalError(f"{path}: no such journal")
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as e:
        raise JournalError(_reason(path, e)) from None
    try:
        try:
            _check_tables(path, db, label)
            names = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "events" not in names:
                raise JournalError(f"{path} is an SQLite database but not a {label} (it has no events)")
            owner = db.execute("SELECT value FROM meta WHERE key = 'owner'").fetchone() if "meta" in names else None
            if owner is not None and owner[0] != label:
                raise JournalError(f"{path} is a {owner[0]}, not a {label}")
            yield from db.execute("SELECT seq, kind, body, at_s FROM events ORDER BY seq")
        except sqlite3.DatabaseError as e:
            raise JournalError(_reason(path, e)) from None
    finally:
        db.close()


def recorded_cluster(path: str | pathlib.Path) -> str | None:
    """The cluster a journal file records (read-only; None: none recorded, or not readable as one)."""
    try:
        db = sqlite3.connect(f"{pathlib.Path(path).resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'cluster'").fetchone()
        return None if row is None else str(row[0])
    except sqlite3.Error:
        return None
    finally:
        db.close()


def wire_bytes(d: Delivery) -> bytes:
    """What a journal keeps of a delivery: its bytes as received (no second encoding), or, on the
    in-memory bus that hands objects over, their encoding with the same envelope."""
    if d.body:
        return d.body
    env = d.envelope
    return DEFAULT_CODEC.encode(
        d.message, source=env.source, sent_at_s=env.sent_at_s, message_id=env.message_id,
        correlation_id=env.correlation_id,
    )


def _open(path: pathlib.Path) -> sqlite3.Connection:
    if path.is_dir():
        raise JournalError(f"{path} is a directory; name the journal's file, e.g. {path / 'mechanism.sqlite'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        file = next((p for p in reversed(path.parents) if p.exists() and not p.is_dir()), None)
        if file == path.parent:
            raise JournalError(f"{path}: {file} exists and is not a directory") from None
        why = f"{file} exists and is not a directory" if file is not None else (e.strerror or str(e))
        raise JournalError(f"{path}: cannot create the directory {path.parent}: {why}") from None
    try:
        return sqlite3.connect(path, isolation_level=None)  # autocommit: one statement, one commit
    except sqlite3.Error as e:
        raise JournalError(_reason(path, e)) from None


def _check_tables(path: pathlib.Path, db: sqlite3.Connection, label: str) -> None:
    names = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if names and "events" not in names:
        raise JournalError(
            f"{path} is an SQLite database but not a {label} (its tables: {', '.join(sorted(names))})"
        )
    for table, needed in TABLES.items():
        if table in names:
            columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            if not needed <= columns:
                raise JournalError(
                    f"{path} is an SQLite database but not a {label} (table {table} lacks "
                    f"{', '.join(sorted(needed - columns))})"
                )


def _reason(path: pathlib.Path, e: sqlite3.Error) -> str:
    if isinstance(e, sqlite3.DatabaseError) and "not a database" in str(e):
        return f"{path} is not an SQLite database (is it the right file?)"
    if "unable to open" in str(e):
        return f"{path}: SQLite cannot open or create it ({e}); can {path.parent} be written?"
    return f"{path}: {e}"
