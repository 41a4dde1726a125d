"""The project's exception tree. Every error the project raises on purpose is one of these.

    GavelError
    ├── ConfigError            a setting (environment variable, CLI flag) is missing or malformed
    │   └── FaultSpecError     a simulation's fault spec (`gavel simulate --faults`) that does not
    │                          parse; names the bad token (sim/faults.py)
    ├── CodecError
    │   ├── DecodeError        bytes that are not a valid message: the reason says why
    │   └── EncodeError        a message that cannot be put on the wire (not finite, too big, ...)
    ├── BusError
    │   ├── BusClosedError     publish/subscribe on a bus that is not started or already closed
    │   ├── BrokerUnreachableError  no broker answered (closed port, timeout, reset, DNS): it
    │   │                      may be starting, so `gavel serve` waits; a refusal is a BusError
    │   ├── UnroutableError    a mandatory publish matched no queue (nobody would receive it)
    │   ├── PublishError       the broker did not confirm a publish (nack, timeout, lost channel)
    │   │   └── QueueFullError a bounded queue (x-max-length, reject-publish) refused it: full;
    │   │                      publish_many raises it after the batch, naming what was refused
    │   ├── SubscriptionError  a queue cannot be subscribed (bad name, exclusive clash, ...)
    │   └── NameClaimedError   a name another live connection holds (Bus.claim: a worker id
    │                          in use by another process)
    ├── PolicyError            the policy library (see policy_service.core)
    │   ├── UnknownPolicyError a name not in the registry; lists the known ones
    │   ├── DuplicatePolicyError  a name registered twice
    │   ├── PolicyParameterError  a parameter the policy does not take, or a bad value for one
    │   └── ProblemError       a policy input that is not a valid problem; names the field
    │       └── JobFieldError  one field of one job out of range (common/job_checks.py); the
    │                          CLI, the trace readers, the mechanism and the policy share it
    ├── TraceError             a job trace that cannot be read, written or generated; names the
    │                          file, line and column (or field)
    ├── JournalError           the mechanism's journal cannot be opened (a directory, not SQLite,
    │                          another application's database, a directory that cannot be made)
    │   └── ReplayError        a journal that cannot be replayed (`gavel whatif`): no finished
    │                          job, no worker, nothing after --from; says which
    ├── CheckpointError        a simulation checkpoint that cannot be resumed (`gavel simulate
    │                          --resume`): not one, damaged, or of another trace, run or version
    ├── PluginError            a plug-in (policy, placement, admission) that cannot be loaded or
    │                          used: unknown name, import error, missing attribute, wrong
    │                          signature, or one that raised; names the kind and the plug-in
    ├── ServiceError           a service cannot start or keeps failing; names the service
    └── WorkloadError          (worker_service.workloads, also a ValueError) a catalog workload
        ├── UnknownWorkloadError  a job type the catalog has no workload for; lists the families
        └── DataDirError       a --data-dir without the files its family reads; says which

Errors carry a human-readable message that names the offending thing (a variable, a field, a
queue), so the CLI can print one line and exit 2 without a traceback.
"""

from __future__ import annotations


class GavelError(Exception):
    """Root of every error the project raises on purpose."""


class ConfigError(GavelError):
    """A setting is missing or malformed. The message names the variable."""


class FaultSpecError(ConfigError):
    """A fault spec (``gavel simulate --faults``) that does not parse. ``token`` is the bad part."""

    def __init__(self, token: str, message: str) -> None:
        super().__init__(f"--faults: {token!r}: {message}")
        self.token = token


class CodecError(GavelError):
    """Base of encoding and decoding failures."""


class DecodeError(CodecError):
    """Bytes that are not a valid message.

    ``reason`` is a short machine-friendly phrase (it becomes the dead-letter reason); ``str(e)``
    is the same phrase, with the offending field path where one is known.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EncodeError(CodecError):
    """A message that cannot be encoded (a non-finite float, a body over the size limit, ...)."""


class BusError(GavelError):
    """Base of transport failures."""


class BusClosedError(BusError):
    """The bus is not started, or already closed."""


class UnroutableError(BusError):
    """A mandatory publish matched no queue, so nobody would ever receive it."""

    def __init__(self, routing_key: str) -> None:
        super().__init__(f"no queue is bound for routing key {routing_key!r}")
        self.routing_key = routing_key


class MisroutedError(BusError):
    """A message arrived under another routing key than its own. Every service publishes a
    message under its own key, so only a foreign or hostile publisher can do this; a handler that
    dispatches on the message's type would otherwise act on it, or drop it without a word."""

    def __init__(self, message_type: str, own_key: str, routing_key: str) -> None:
        super().__init__(f"a {message_type} belongs on {own_key}, it arrived on {routing_key}")
        self.routing_key = routing_key


class PublishError(BusError):
    """The broker refused or did not confirm a publish."""


class QueueFullError(PublishError):
    """A queue the message routes to is bounded (``x-max-length`` with ``reject-publish``,
    common/topology.py) and full: the broker refused the message there (queues with room still
    took their copy, as RabbitMQ does). From ``publish_many``: raised once every message of the
    batch is settled; ``refused`` holds the positions of the refused ones, in order, and
    ``message_ids`` the ids of all."""

    def __init__(
        self, message: str, *, refused: tuple[int, ...] = (), message_ids: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.refused = refused
        self.message_ids = message_ids


class SubscriptionError(BusError):
    """A subscription could not be made."""


class NameClaimedError(BusError):
    """Another live connection holds the name (``Bus.claim``): a second process started as a
    worker that is already running. The message names the name and says what to do."""


class BrokerUnreachableError(BusError):
    """No broker answered at the URL. Unlike a refusal (wrong credentials, unknown vhost), trying
    again later may work: the broker may still be starting."""


class PolicyError(GavelError):
    """Base of the policy library's errors."""


class UnknownPolicyError(PolicyError):
    """A policy name that is not registered. The message lists the known names."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown policy {name!r}; known policies: {', '.join(sorted(known))}")
        self.name = name
        self.known = sorted(known)


class DuplicatePolicyError(PolicyError):
    """A policy name registered twice (the registry refuses to shadow a policy silently)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"policy {name!r} is already registered")
        self.name = name


class PolicyParameterError(PolicyError):
    """A parameter a policy does not take, or a value it cannot use. The message names both."""


class ProblemError(PolicyError):
    """A policy input that is not a valid problem. The message names the field.

    ``job_ids``: the jobs the problem is refused because of, when it is their fault alone (a bad
    field, a deadline no allocation can meet): the caller may take them out and ask again, so
    one job cannot stop every solve (issue 9). Empty when no job is to blame.
    """

    def __init__(self, message: str, *, job_ids: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.job_ids = tuple(job_ids)

    def __reduce__(self) -> tuple[object, ...]:  # keyword arguments survive pickling (worker processes)
        return (type(self), self.args, {"job_ids": self.job_ids})


class JobFieldError(ProblemError):
    """One field of a job that no policy accepts. ``str(e)`` is ``"<field>: <reason>"``; ``field``
    is the path as the caller named it (``jobs[3].slo_s``), ``reason`` the rest, so a command
    line can put its flag in the field's place."""

    def __init__(self, field: str, reason: str, *, job_ids: tuple[str, ...] = ()) -> None:
        super().__init__(f"{field}: {reason}", job_ids=job_ids)
        self.field = field
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.field, self.reason), {"job_ids": self.job_ids})


class TraceError(GavelError):
    """A job trace that cannot be read, written or generated.

    Not a ProblemError: a trace is not a policy input, and ``except PolicyError`` should not catch
    a typo on line 812 of a trace file. ``str(e)`` reads ``file:line: column: reason``, leaving out
    the parts that are unknown; the parts are kept as attributes too.
    """

    def __init__(self, reason: str, *, source: str | None = None, line: int | None = None, column: str | None = None) -> None:
        where = source or ""
        if line is not None:
            where = f"{where}:{line}" if where else f"line {line}"
        parts = [p for p in (where, column) if p]
        super().__init__(": ".join([*parts, reason]))
        self.reason = reason
        self.source = source
        self.line = line
        self.column = column


class JournalError(GavelError):
    """The mechanism's journal cannot be opened or is not a journal. The message names the file."""


class ReplayError(JournalError):
    """A journal that is readable but cannot be replayed through the simulator (sim/whatif): the
    message says what it lacks (a finished job, a worker, a job after ``--from``)."""


class PluginError(GavelError):
    """A plug-in that cannot be loaded or used (common/plugins.py). ``str(e)`` reads
    ``<kind> plug-in '<spec>': <reason>``, one line; the parts are kept as attributes."""

    def __init__(self, kind: str, spec: str, reason: str) -> None:
        super().__init__(f"{kind} plug-in {spec!r}: {reason}")
        self.kind = kind
        self.spec = spec
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:  # crosses process boundaries (sweep workers)
        return (type(self), (self.kind, self.spec, self.reason))


class ServiceError(GavelError):
    """A service cannot start or keeps failing."""


class CommandFailed(GavelError):
    """A command that cannot do what was asked (the command line's, or a scenario of the simulator
    it runs); the message is the one line the user sees, the exit code the process's."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class CheckpointError(GavelError):
    """A simulation checkpoint that cannot be resumed; the message names the file and what
    differs from the run that asks (sim/checkpoint.py)."""
