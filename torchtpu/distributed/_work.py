"""Asynchronous collectives: the ``Work`` the "tpu" process group returns, and the ordered
background thread that runs a group's host-side communication.

A collective returns at once with a :class:`TpuWork`; its ``wait()`` blocks until the
result is in the tensors and raises the collective's ``DistributedError`` if it failed;
``get_future()`` is a ``torch.futures.Future`` completed without the caller blocking (DDP's
gradient buckets use it). What the work waits on is a *pending* object with ``wait()``,
``done()`` and ``add_done_callback(cb)``:

- the host transport: a :class:`Job` on the group's :class:`Worker` thread (copy to the
  host, gloo, result back), so the caller keeps enqueuing device work meanwhile;
- the xla transport: the collective's program is already enqueued on the device; the
  pending object blocks on its result buffers.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.futures import Future

from .. import _spans

# Room for values in every cross-rank check's exchange (the all_gather every rank makes before
# a collective): a small all_reduce's values ride in it, so it needs one round trip, not two
CHECK_SLOT_BYTES = 16 << 10


class CrossRankCheck(Protocol):
    """The process group's cross-rank check of one collective call: one all_gather of a
    fixed-size slot per rank -- the hash of what the rank is calling and ``payload`` (at
    most :data:`CHECK_SLOT_BYTES` of uint8, or nothing). Raises the ``DistributedError``
    that names every rank's call when they differ. Returns every rank's payload area, a
    ``(group size, CHECK_SLOT_BYTES)`` uint8 tensor, when every rank sent a payload; None
    when some rank did not (the collective then runs as usual on every rank)."""

    def __call__(self, payload: torch.Tensor | None = None) -> torch.Tensor | None: ...


class Pending(Protocol):
    """What a work waits on."""

    def wait(self) -> None: ...

    def done(self) -> bool: ...

    def add_done_callback(self, cb: Callable[[BaseException | None], None]) -> None: ...


# The worker whose thread is running the current code, if any: a job's callbacks run there
_on_thread = threading.local()


def current_worker() -> Worker | None:
    return getattr(_on_thread, "worker", None)


class Job:
    """One function to run on a :class:`Worker` (``worker``; None: run by whoever calls
    ``run``); ``wait()`` blocks until it ran and re-raises what it raised."""

    __slots__ = ("_fn", "_cv", "_done", "_error", "_callbacks", "_worker")

    def __init__(self, fn: Callable[[], None], worker: Worker | None = None) -> None:
        self._worker = worker
        self._fn = fn
        self._cv = threading.Condition()
        self._done = False
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[BaseException | None], None]] = []

    def run(self) -> None:
        try:
            self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits
            self._error = e
        self._fn = None  # drop the captured tensors and buffers now
        with self._cv:
            self._done = True
            self._cv.notify_all()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self._error)

    def wait(self) -> None:
        if not self._done and self._worker is not None and self._worker is current_worker():
            self._worker.run_until(self)  # waited for from a callback on the thread that runs it
        with self._cv:
            while not self._done:
                self._cv.wait()
        if self._error is not None:
            raise self._error

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, cb: Callable[[BaseException | None], None]) -> None:
        with self._cv:
            if not self._done:
                self._callbacks.append(cb)
                return
        cb(self._error)


class Worker:
    """One daemon thread that runs jobs in the order they were submitted. Each group's
    host communication goes through one worker: gloo pairs a collective with its peers'
    by the order in which they were issued, so it must be issued in program order."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._last: Job | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], None]) -> Job:
        job = Job(fn, self)
        with self._lock:  # submission order is run order, from any thread
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._last = job
            self._queue.put(job)
        return job

    def idle(self) -> bool:
        """Whether every job submitted so far has run."""
        last = self._last
        return last is None or last.done()

    def drain(self) -> None:
        """Wait until every job submitted so far has run (their errors belong to their
        own works, not to the caller)."""
        last = self._last
        if last is None or last.done():
            return
        try:
            last.wait()
        except BaseException:  # noqa: BLE001 - reported by that job's work
            pass

    def stop(self) -> None:
        with self._lock:
            if self._thread is not None:
                self._queue.put(None)
                self._thread = None

    def _loop(self) -> None:
        _on_thread.worker = self
        while (job := self._queue.get()) is not None:
            job.run()

    def run_until(self, job: Job) -> None:
        """Run the queued jobs, in order, until ``job`` has run: called on this worker's own
        thread by a callback of an earlier job that waits for ``job`` (a DDP communication
        hook's callback issuing the next collective and waiting for it, as PowerSGD's does),
        which would otherwise wait for itself."""
        while not job.done():
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:  # not queued here: nothing to run it but its own thread
                return
            if nxt is None:  # stop() came first: leave the loop its sentinel
                self._queue.put(None)
                return
            nxt.run()


_completer = Worker("torchtpu-collective-completion")


def call_when_done(wait: Callable[[], None], cb: Callable[[BaseException | None], None]) -> None:
    """Run ``wait`` on the completion thread, then ``cb`` with what it raised (or None):
    a pending object's ``add_done_callback`` without blocking its caller."""

    def wait_then_call() -> None:
        try:
            wait()
        except BaseException as e:  # noqa: BLE001 - handed to the callback
            cb(e)
            return
        cb(None)

    _completer.submit(wait_then_call)


class Posted:
    """A point-to-point transfer gloo has posted (the host transport): ``finish`` runs once,
    on the first thread that sees it complete (a recv's write-back into its tpu tensors);
    ``keep`` holds the host memory gloo reads or writes until then.

    Posting at once and waiting later is what lets two ranks exchange in both directions
    (a pipeline schedule's ``batch_isend_irecv`` of a send and a recv on each side): a send
    that waited for its peer's recv before returning would wait for a peer doing the same."""

    __slots__ = ("_work", "_finish", "_keep", "_lock", "_finished", "_error")

    def __init__(self, work: Any, keep: Any = None, finish: Callable[[], None] | None = None) -> None:
        self._work, self._keep, self._finish = work, keep, finish
        self._lock = threading.Lock()
        self._finished = False
        self._error: BaseException | None = None

    def wait(self) -> None:
        with self._lock:  # gloo's wait, once: a second wait on a recv would wait for another message
            if not self._finished:
                try:
                    self._work.wait()
                    if self._finish is not None:
                        self._finish()
                except BaseException as e:
                    self._error = e
                    raise
                finally:
                    self._finished = True
                    self._keep = self._finish = None
            elif self._error is not None:
                raise self._error

    def done(self) -> bool:
        """Whether the transfer is over, a recv's value written back: once gloo's own work
        says it completed, as ``is_completed()`` of a gloo work on CPU tensors does."""
        if not self._finished and self._work.is_completed():
            try:
                self.wait()
            except BaseException:  # noqa: BLE001 - over, with an error that wait() raises
                return True
        return self._finished

    def source_rank(self) -> int:
        """The rank a recv from any source came from (after ``wait``)."""
        return self._work._source_rank()

    def add_done_callback(self, cb: Callable[[BaseException | None], None]) -> None:
        call_when_done(self.wait, cb)


class Launched:
    """A collective whose program is already enqueued on the device (the xla transport):
    done when its result buffers are ready."""

    __slots__ = ("_wait", "_ready", "_done", "_name")

    def __init__(self, wait: Callable[[], None], ready: Callable[[], bool], name: str = "collective") -> None:
        self._wait, self._ready, self._done, self._name = wait, ready, False, name

    def wait(self) -> None:
        self._wait()
        self._done = True

    def done(self) -> bool:
        return self._done or self._ready()

    def add_done_callback(self, cb: Callable[[BaseException | None], None]) -> None:
        """Run ``cb`` once the buffers are ready, on a background thread (completions are
        in launch order: the device runs collectives in that order)."""
        call_when_done(self._traced_wait, cb)

    def _traced_wait(self) -> None:
        # the span shows how long the collective stayed in flight after its launch
        with _spans.maybe_span(f"torchtpu::collective ({self._name})", transport="xla"):
            self.wait()


class _Failed:
    """A failed collective's error, carried through a future's value."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _unwrap(fut: Future) -> Any:
    value = fut.value()
    if isinstance(value, _Failed):
        raise value.error  # marks the chained future as failed (its wait() raises)
    return value


class TpuWork(dist.Work):
    """The ``Work`` of one collective (or of a coalesced block of them).

    ``pending`` is None for work that completed before it was returned. ``on_error`` turns
    a transport error into the process group's ``DistributedError`` naming the collective."""

    def __init__(
        self,
        result: Any,
        pending: Sequence[Pending] = (),
        on_error: Callable[[BaseException], BaseException] | None = None,
    ) -> None:
        super().__init__()
        self._result = result
        self._pending = list(pending)
        self._on_error = on_error
        self._future: Future | None = None
        self._lock = threading.Lock()
        self.source_rank_value = -1  # recv without src: the rank it came from

    def _error(self, e: BaseException) -> BaseException:
        return self._on_error(e) if self._on_error is not None else e

    def wait(self, timeout: Any = None) -> bool:
        """Block until the result is in the tensors; raise if the collective failed.
        (The transport's own timeout, the group's, applies; ``timeout`` is not used.)"""
        for p in self._pending:
            try:
                p.wait()
            except BaseException as e:
                err = self._error(e)
                if err is e:
                    raise
                raise err from e
        return True

    def is_completed(self) -> bool:
        return all(p.done() for p in self._pending)

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self) -> Any:
        if not self.is_completed():
            return None
        try:
            self.wait()
        except BaseException as e:  # noqa: BLE001 - returned, as c10d's Work does
            return e
        return None

    def result(self) -> Any:
        return self._result if isinstance(self._result, list) else []

    def _source_rank(self) -> int:
        """The rank a recv came from; for a recv from any rank, known once it completed."""
        if self.source_rank_value < 0:
            for p in self._pending:
                if isinstance(p, Posted):
                    self.wait()
                    self.source_rank_value = p.source_rank()
        return self.source_rank_value

    def get_future(self) -> Future:
        """A future completed with the result (the tensors) once the collective is done,
        without blocking the caller; it fails with the collective's error."""
        with self._lock:
            if self._future is None:
                self._future = self._make_future()
            return self._future

    def _make_future(self) -> Future:
        if self._pending and current_worker() is not None:
            return self._completed_future()
        raw: Future = Future()
        chained = raw.then(_unwrap)
        left = [len(self._pending)]
        first_error: list[BaseException] = []
        count_lock = threading.Lock()

        def one_done(err: BaseException | None) -> None:
            with count_lock:
                if err is not None and not first_error:
                    first_error.append(self._error(err))
                left[0] -= 1
                if left[0]:
                    return
            raw.set_result(_Failed(first_error[0]) if first_error else self._result)

        if not self._pending:
            raw.set_result(self._result)
        for p in self._pending:
            p.add_done_callback(one_done)
        return chained

    def _completed_future(self) -> Future:
        """The future, completed before it is returned: asked for on one of our worker
        threads (in another collective's callback), where the completion would be queued
        behind the callback itself -- a ``wait()`` on it would never return. NCCL's
        futures are complete at launch, so such callbacks work on CUDA."""
        fut: Future = Future()
        try:
            self.wait()
        except BaseException as e:  # noqa: BLE001 - the future fails with it
            fut.set_exception(e)
            return fut
        fut.set_result(self._result)
        return fut


def completed(result: Any) -> TpuWork:
    """The work of a collective that already finished."""
    return TpuWork(result)
