"""Where the `ray` data plane keeps its `PlaneIndex`: three placements answering through one protocol
(:class:`IndexPlacement`), so the client asks its placement and never branches on which it is.

`StoreIndex` (default): a long-lived `StoreActor` any process may ask. `DriverIndex`: the driver's client,
no actor round trips; workers read snapshots it hands them and hand writes back. `WorkerIndex`: a
`DriverIndex` client inside a worker, with no index (receipts go back via `RayDataPlane.commit_receipts`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import ray

from .client import encoded
from .errors import DataPlaneError, fmt_keys
from .index import PENDING, Committed, LookupPlan, Pending, PlaneIndex, WriteSpec, remote_method
from .meta import KVBatchMeta
from .ray_objects import Background, Failed, Receipt, Snapshot, Stored, WriteBack, put_parts

__all__ = ["DriverIndex", "IndexPlacement", "StoreActor", "StoreIndex", "WorkerIndex"]

_PENDING_TIMEOUT_S = 60.0  # a reader gives up on a committed chunk whose data never came
_ABSORBED_KEPT = 4096  # uids of taken write-backs remembered (a receipt handed in twice is taken once)



class IndexPlacement(Protocol):
    """What the `ray` client asks of wherever its index lives. ``key`` names the index in receipts;
    ``answers_lookups``: reads by key are answered here (not in a worker of a driver-held index, which reads only
    what the metas it is sent carry)."""

    key: str
    answers_lookups: bool

    def for_worker(self) -> IndexPlacement: ...  # the placement a pickled client in a worker gets

    def call(self, method: Callable, *args: Any) -> Any: ...  # a `PlaneIndex` method, answered

    def send(self, method: Callable, *args: Any) -> None: ...  # one whose answer nobody waits for

    def commit(self, pid: str, ids: list[str], columns: dict, spec: WriteSpec,
               bounds: list[int] | None) -> tuple[Committed, Stored | None, WriteBack | None]: ...

    def lookup(self, pid: str, ids: list[str], fields: list[str]) -> LookupPlan: ...

    def verifier(self, pid: str, ids: list[str], expected: dict) -> Callable[[], bool]: ...

    def take(self, receipt: Receipt) -> Receipt: ...  # a worker's receipt, its pending write taken (a new one)

    def raise_refused(self) -> None: ...  # a worker's write this index refused, raised once

    def located(self, meta: KVBatchMeta) -> KVBatchMeta: ...  # the meta a worker is sent

    def outgoing(self, meta: KVBatchMeta) -> KVBatchMeta: ...  # the receipt of a put made here, as returned

    def close(self) -> None: ...


class StoreActor:
    """Holds the `PlaneIndex` (and every column's ObjectRef); sync, one call at a time."""

    def __init__(self, adopt: bool) -> None:
        self.index = PlaneIndex()
        self.adopt = adopt
        self._deferred: dict[str, DataPlaneError] = {}  # client id -> error of a call it did not wait on
        self._background = Background()  # releasing refs: the reply need not wait on it

    def call(self, name: str, *args: Any, client: str | None = None) -> Any:
        """``PlaneIndex.<name>(*args)``: the name is what crosses from the client's `StoreIndex.call`."""
        if client is not None and client in self._deferred:
            raise self._deferred.pop(client)  # a refused no-wait request: its caller hears it now
        method = remote_method(name)
        if method is PlaneIndex.commit and self.adopt:
            pid, ids, payloads, spec = args
            # Re-put so this actor owns the objects and they outlive the producer.
            mine = {stored.refs: Stored(tuple(ray.put(ray.get(ref)) for ref in stored.refs), stored.starts)
                    for stored, _ in payloads.values()}
            args = (pid, ids, {f: (mine[stored.refs], name) for f, (stored, name) in payloads.items()}, spec)
        try:
            return method(self.index, *args)
        finally:
            self._drop_freed()

    def _drop_freed(self) -> None:
        if self.index.freed:
            self._background.drop(self.index.freed)
            self.index.freed = []

    def attach(self, pid: str, chunks: dict[str, int], payload: Stored | Failed) -> None:
        """The data of a commit answered earlier (one `Stored` for all of `chunks`' fields)."""
        self.index.attach(pid, chunks, {f: payload if isinstance(payload, Failed) else (payload, f) for f in chunks})
        self._drop_freed()

    def call_nowait(self, name: str, *args: Any, client: str | None = None) -> None:
        """Fire-and-forget `call`; an error is kept for the client's next `call` (Ray keeps one caller's order)."""
        try:
            self.call(name, *args, client=client)
        except DataPlaneError as err:
            if client is not None:
                note = f"{err} (raised by an earlier {name} that returned without waiting: wait=False)"
                self._deferred.setdefault(client, type(err)(note))

    def ping(self) -> bool:
        return True


def _wait(answer: Any) -> Any:
    try:
        return ray.get(answer)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, DataPlaneError):
            raise err.cause from None
        raise
    except ray.exceptions.RayActorError:
        raise DataPlaneError("data plane: its index's store actor died (the keys of the step in flight are lost); "
                             "the run stops: resume from its last checkpoint with checkpointing.resume=true") from None


class StoreIndex:
    """The index in a `StoreActor` (`owns`: this client made it and kills it on close).

    `adopt` (owner="store"): the actor re-puts every column, so data outlives its producer (one more copy)."""

    answers_lookups = True

    def __init__(self, actor: Any, owns: bool, adopt: bool) -> None:
        self.actor, self.owns, self.adopt = actor, owns, adopt
        self.key = actor._actor_id.hex()  # names the store in receipts
        self.client_id = uuid.uuid4().hex  # names this client to the store (for errors of no-wait calls)

    @classmethod
    def start(cls, name: str | None, adopt: bool) -> StoreIndex:
        opts: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 1}
        if name is not None:
            opts["name"] = name
        actor = ray.remote(StoreActor).options(**opts).remote(adopt)
        ray.get(actor.ping.remote())
        return cls(actor, owns=True, adopt=adopt)

    def for_worker(self) -> StoreIndex:
        return StoreIndex(self.actor, owns=False, adopt=self.adopt)

    def call(self, method: Callable, *args: Any) -> Any:
        return _wait(self.actor.call.remote(method.__name__, *args, client=self.client_id))

    def send(self, method: Callable, *args: Any) -> None:
        """No answer needed (saves a round trip); this caller's next call sees it, or its refusal."""
        self.actor.call_nowait.remote(method.__name__, *args, client=self.client_id)

    def commit(self, pid: str, ids: list[str], columns: dict, spec: WriteSpec,
               bounds: list[int] | None) -> tuple[Committed, Stored | None, WriteBack | None]:
        if self.adopt:
            # The store must re-put before this returns (the producer may exit); no receipt (it would pin our copy).
            stored = put_parts(encoded(columns), bounds)
            return self.call(PlaneIndex.commit, pid, ids, {f: (stored, f) for f in columns}, spec), None, None
        # Commit first (checks and a PENDING payload), copy the columns while the store answers, then a
        # no-wait `attach`; a reader that sees PENDING before it arrives asks again.
        answer = self.actor.call.remote(PlaneIndex.commit.__name__, pid, ids, {f: PENDING for f in columns}, spec,
                                        client=self.client_id)
        try:
            payload: Stored | Failed = put_parts(encoded(columns), bounds)
        except Exception as err:  # noqa: BLE001 - e.g. the object store is full: readers must hear why, not wait
            payload = Failed(f"{type(err).__name__}: {err}")
        committed = _wait(answer)  # a refusal raises here; the objects just go
        self.actor.attach.remote(pid, committed.chunks, payload)  # (refs inside an argument are not fetched)
        if isinstance(payload, Failed):
            raise DataPlaneError(f"partition {pid!r}: storing fields {list(columns)} "
                                 f"of keys {fmt_keys(ids)} failed: {payload.reason}")
        return committed, payload, None

    def lookup(self, pid: str, ids: list[str], fields: list[str]) -> LookupPlan:
        deadline = time.monotonic() + _PENDING_TIMEOUT_S
        while True:
            plan = self.call(PlaneIndex.lookup, pid, ids, fields)
            waiting = [f for f, parts in plan.parts.items() if any(isinstance(p, Pending) for p, _, _ in parts)]
            failed = [(f, p.reason) for f, parts in plan.parts.items() for p, _, _ in parts if isinstance(p, Failed)]
            if failed:
                raise DataPlaneError(
                    f"partition {pid!r}: field {failed[0][0]!r} of keys {fmt_keys(ids)} was never stored "
                    f"({failed[0][1]}); write it again"
                )
            if not waiting:
                return plan
            if time.monotonic() > deadline:
                raise DataPlaneError(
                    f"partition {pid!r}: fields {waiting} of keys {fmt_keys(ids)} were committed but their "
                    f"data has not arrived in {_PENDING_TIMEOUT_S:.0f} "
                    "s (did the writer die mid-put?); write them again"
                )
            time.sleep(0.001)  # the writer's attach is on its way (a race between two callers)

    def verifier(self, pid: str, ids: list[str], expected: dict) -> Callable[[], bool]:
        """Starts the store's check that `expected` chunks are current; the answer when called."""
        check = self.actor.call.remote(PlaneIndex.verify.__name__, pid, ids, expected, client=self.client_id)
        return lambda: _wait(check)

    def take(self, receipt: Receipt) -> Receipt:
        """Nothing to take: the store took every write when it was made."""
        return receipt

    def raise_refused(self) -> None:
        """Nothing: a refused write raised when it was made."""

    def located(self, meta: KVBatchMeta) -> KVBatchMeta:
        """As it is: a worker asks the store."""
        return meta

    def outgoing(self, meta: KVBatchMeta) -> KVBatchMeta:
        return meta

    def close(self) -> None:
        if self.owns:
            ray.kill(self.actor)  # drops every ref the index held


class DriverIndex:
    """The index in the driver's process; calls serialised by a lock, freed refs dropped on `background`."""

    answers_lookups = True

    def __init__(self, background: Background) -> None:
        self.key = f"driver:{uuid.uuid4().hex}"
        self.index = PlaneIndex()
        self._lock = threading.RLock()
        self._background = background  # the client's: releases the refs of freed chunks
        self._absorbed: OrderedDict[str, dict[str, int]] = OrderedDict()  # write-back uid -> its chunk ids
        self.refused: DataPlaneError | None = None  # a worker's write the index refused, raised next call

    def for_worker(self) -> WorkerIndex:
        return WorkerIndex(self.key)

    def call(self, method: Callable, *args: Any) -> Any:
        with self._lock:
            out = method(self.index, *args)
            freed, self.index.freed = self.index.freed, []
        if freed:
            self._background.drop(freed)
        return out

    send = call  # local: the answer costs nothing

    def commit(self, pid: str, ids: list[str], columns: dict, spec: WriteSpec,
               bounds: list[int] | None) -> tuple[Committed, Stored, None]:
        stored = put_parts(encoded(columns), bounds)  # (a refused commit drops the objects)
        return self.call(PlaneIndex.commit, pid, ids, {f: (stored, f) for f in columns}, spec), stored, None

    def lookup(self, pid: str, ids: list[str], fields: list[str]) -> LookupPlan:
        return self.call(PlaneIndex.lookup, pid, ids, fields)

    def verifier(self, pid: str, ids: list[str], expected: dict) -> Callable[[], bool]:
        return lambda: self.call(PlaneIndex.verify, pid, ids, expected)  # local: a few numpy compares

    def take(self, receipt: Receipt) -> Receipt:
        """Commit a worker's pending write as the store would; returns the receipt that replaces it (its chunk ids,
        or, refused, no objects; the refusal is kept for the client's next call)."""
        if receipt.pending is None:
            return receipt
        uid, spec = receipt.pending.uid, receipt.pending.spec
        with self._lock:
            chunks = self._absorbed.get(uid)
            if chunks is None:
                payloads = {f: (receipt.stored, f) for f in receipt.chunks}
                try:
                    chunks = self.call(PlaneIndex.commit, receipt.pid, list(receipt.ids), payloads, spec).chunks
                except DataPlaneError as err:
                    self.refused = type(err)(f"{err} (a worker's write, refused when its receipt reached the driver)")
                    return receipt.refused()
                self._absorbed[uid] = chunks
                if len(self._absorbed) > _ABSORBED_KEPT:
                    self._absorbed.popitem(last=False)
        return receipt.taken(chunks)

    def raise_refused(self) -> None:
        """Raise, once, the error of a worker's write this index refused in `take`."""
        if self.refused is not None:
            err, self.refused = self.refused, None
            raise err

    def snapshot(self, pid: str, ids: tuple) -> Snapshot:
        """Where `ids`' fields are now."""
        with self._lock:
            where, gone = self.index.locate(pid, ids)
        return Snapshot(self.key, pid, ids, where, gone)

    def located(self, meta: KVBatchMeta) -> KVBatchMeta:
        """``meta`` with a snapshot of where its keys' fields are now, in place of this index's earlier ones (a
        worker has no index to ask)."""
        others = tuple(x for x in meta.locations if getattr(x, "store", None) != self.key)
        return meta.with_locations((*others, self.snapshot(meta.partition_id, meta.sample_ids)))

    def outgoing(self, meta: KVBatchMeta) -> KVBatchMeta:
        return meta

    def close(self) -> None:
        with self._lock:
            self.index = PlaneIndex()  # drops every ref the index held


class WorkerIndex:
    """A worker's side of a `DriverIndex`: no index here. Writes go back in receipts; nothing else asks."""

    answers_lookups = False

    def __init__(self, key: str) -> None:
        self.key = key

    def for_worker(self) -> WorkerIndex:
        return self

    def call(self, method: Callable, *args: Any) -> Any:
        raise DataPlaneError(
            f"data_plane index = 'driver': the {method.__name__!r} request is answered by the driver only; a worker "
            "reads the metas the driver hands it and writes under them (or use index='store')"
        )

    send = call

    def lookup(self, pid: str, ids: list[str], fields: list[str]) -> LookupPlan:
        return self.call(PlaneIndex.lookup, pid, ids, fields)

    def verifier(self, pid: str, ids: list[str], expected: dict) -> Callable[[], bool]:
        return lambda: self.call(PlaneIndex.verify, pid, ids, expected)

    def commit(self, pid: str, ids: list[str], columns: dict, spec: WriteSpec,
               bounds: list[int] | None) -> tuple[Committed, Stored, WriteBack]:
        """The objects stored, the commit left for the driver's index (`DriverIndex.take`)."""
        stored = put_parts(encoded(columns), bounds)
        lens = [None] * len(ids) if spec.seq_lens is None else [int(x) for x in spec.seq_lens]
        committed = Committed(lens, spec.tags, None, {f: -1 for f in columns})
        return committed, stored, WriteBack(uuid.uuid4().hex, spec)

    def take(self, receipt: Receipt) -> Receipt:
        """Nothing: a worker holds no index."""
        return receipt

    def raise_refused(self) -> None:
        """Nothing: a worker holds no index."""

    def located(self, meta: KVBatchMeta) -> KVBatchMeta:
        return meta

    def outgoing(self, meta: KVBatchMeta) -> KVBatchMeta:
        """The receipt a worker's put returns to the driver, without its snapshots: the driver's index knows better,
        and the refs would cost a borrow per step."""
        return meta.with_locations(x for x in meta.locations if not isinstance(x, Snapshot))

    def close(self) -> None:
        pass
