"""Multi-process XLA: every process's PjRT client joins one distributed runtime, and
collectives run as small XLA programs over the devices of a group.

The ONLY module (with ``pjrt.py``) that touches jaxlib for distributed work. What it does
(measured facts: ``notes/cpu-collectives.md``):

- ``join`` bootstraps jaxlib's coordination service from the c10d store the process group
  was created with: rank 0 starts the service in a helper process (``_coordinator.py``)
  on a free port and publishes the address through the store; every rank reads it,
  connects, and starts the PjRT client with ``distributed_client`` / ``node_id`` /
  ``num_nodes`` (and gloo TCP collectives on the cpu platform).
- ``compile_for_group`` / ``run_for_group`` compile and run a program in replica mode over
  the devices of a group of global ranks (replica ``i`` = the group's ``i``-th rank);
  ``launch_for_group`` / ``wait_for_group`` split the run for asynchronous collectives;
  ``group_executable`` keeps the compiled programs (with functional collectives inside)
  that ``runner/program.py`` builds for a group.

Why the service lives in a helper process, not in rank 0: a client whose service is gone
aborts its process (SIGABRT after the heartbeat timeout; jaxlib 0.10.2's
``missed_heartbeat_callback`` is unusable from Python), so the service must outlive every
rank. The helper serves until the last rank's process has ended (see ``_coordinator.py``).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .. import config, metrics
from ..errors import TpuRuntimeError
from . import pjrt

_HELPER = Path(__file__).with_name("_coordinator.py")
_KEY = "torchtpu_xla_coordinator"
_HEARTBEAT_S = 30  # a task silent this long is reported dead to the others
_COLLECTIVE_TIMEOUT_FLAG = "--xla_cpu_collective_timeout_seconds"


class Store(Protocol):
    """What ``join`` needs of a c10d store (``set``; ``get`` blocks until the key exists)."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...


class CollectiveError(TpuRuntimeError):
    """A collective program failed: a peer died, timed out, or the group's links are closed."""


class CollectiveMismatchError(CollectiveError):
    """The ranks of a group built programs whose collectives differ: run, they would meet
    in the wrong collectives (silently mixed values, or gloo aborting the process on a
    size mismatch), so no rank runs them."""


class Cluster:
    """This process's membership in the distributed runtime (one per process)."""

    def __init__(self, rank: int, world: int, address: str, lifeline: tuple[str, int], gloo_host: str, timeout_s: float):
        from jaxlib import _jax

        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        # Held open for the life of the process: the helper serves until every lifeline has
        # closed, which the kernel does when this process ends, however it ends.
        self.lifeline = socket.create_connection(lifeline, timeout=timeout_s)
        self.client = _jax.get_distributed_runtime_client(
            address,
            rank,
            init_timeout=max(1, int(timeout_s)),
            heartbeat_timeout=_HEARTBEAT_S,
            shutdown_timeout=10,
            use_compression=True,
        )
        try:
            self.client.connect()  # returns when all `world` ranks have connected
        except _jax.JaxRuntimeError as e:
            raise TpuRuntimeError(
                f"torchtpu: rank {rank} of {world} could not join the XLA distributed runtime at {address} "
                f"within {timeout_s:g}s: {_first_line(e)}"
            ) from e
        self.gloo_host = gloo_host
        self.device_ids: list[int] = []  # global device id of each rank's device, by rank
        self._closed = False

    def exchange_devices(self, device_id: int) -> None:
        """Learn every rank's device through the service's key-value store (a plugin may
        number processes its own way, so a device's process_index need not be the rank)."""
        self.client.key_value_set(f"torchtpu/device/{self.rank}", str(device_id))
        wait_ms = max(1000, int(self.timeout_s * 1000))
        self.device_ids = [int(self.client.blocking_key_value_get(f"torchtpu/device/{r}", wait_ms)) for r in range(self.world)]

    def client_kwargs(self, platform: str) -> dict[str, Any]:
        """Arguments that make ``platform``'s PjRT client node ``rank`` of ``world``.
        Called by ``pjrt.Runtime`` just before it creates the client (after XLA_FLAGS were
        verified): XLA reads the collective timeout from XLA_FLAGS at the first client."""
        if platform == "tpu":  # libtpu finds its peers itself (as jax's TPU client does)
            return {}
        if platform != "cpu":  # the CUDA plugin: NCCL, bootstrapped through this client
            return {"options": {"node_id": self.rank, "num_nodes": self.world}, "distributed_client": self.client}
        _set_collective_timeout(self.timeout_s)
        from jaxlib import _jax

        minutes = max(1, int(self.timeout_s // 60) + 1)
        return {
            "distributed_client": self.client,
            "node_id": self.rank,
            "num_nodes": self.world,
            "collectives": _jax.make_gloo_tcp_collectives(distributed_client=self.client, hostname=self.gloo_host),
            "num_devices": 1,
            "get_local_topology_timeout_minutes": minutes,
            "get_global_topology_timeout_minutes": minutes,
        }

    def shutdown(self) -> None:
        """Disconnect from the service (at exit). The helper shuts the service down itself
        once every rank's lifeline has closed, so no rank waits for the others here."""
        if self._closed:
            return
        self._closed = True
        try:
            self.client.shutdown()
        except Exception:  # noqa: BLE001 - the service may already report this task dead
            pass
        self.lifeline.close()


_cluster: Cluster | None = None
_join_lock = threading.Lock()


def cluster() -> Cluster | None:
    """This process's cluster membership, or None when the runtime runs alone."""
    return _cluster


def join(store: Store, rank: int, world: int, timeout_s: float, host: str) -> pjrt.Runtime:
    """Start this process's runtime as node ``rank`` of ``world`` (idempotent for the same
    rank and world). ``host`` is an address of the rendezvous host the ranks share (the
    store's), used to find this machine's own address towards it."""
    global _cluster
    with _join_lock:
        if _cluster is not None:
            if (_cluster.rank, _cluster.world) != (rank, world):
                raise TpuRuntimeError(
                    f"torchtpu: this process already joined the XLA distributed runtime as rank {_cluster.rank} of "
                    f"{_cluster.world}; it cannot join again as rank {rank} of {world} (one runtime per process)"
                )
            return pjrt.get()
        if pjrt.started():
            raise TpuRuntimeError(
                "torchtpu: TORCHTPU_COLLECTIVES=xla needs init_process_group() to run before this process first "
                "uses the tpu device: the XLA client must be created as a member of the distributed runtime, and "
                "device buffers and compiled programs cannot move to a new client. Call "
                "torch.distributed.init_process_group() before creating tpu tensors (and before "
                "torch.tpu.is_available() or get_device_name(), which start the device), or set "
                "TORCHTPU_COLLECTIVES=host to use the host (gloo) transport."
            )
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # before the first jaxlib log line
        local = _local_address(host)
        address = _rendezvous(store, rank, world, timeout_s, local)
        service, lifeline = address.rsplit(":", 1)
        lifeline_host = service.rsplit(":", 1)[0].strip("[]")
        _cluster = Cluster(rank, world, service, (lifeline_host, int(lifeline)), local, timeout_s)
        atexit.register(_cluster.shutdown)
        rt = pjrt.start(_cluster)
        _cluster.exchange_devices(rt.device.id)
        return rt


def _rendezvous(store: Store, rank: int, world: int, timeout_s: float, local: str) -> str:
    """Rank 0 starts the service and publishes ``host:port:lifeline_port``; all read it."""
    if rank == 0:
        port, lifeline = _start_helper(world, timeout_s)
        store.set(_KEY, f"{_bracket(local)}:{port}:{lifeline}")
    return store.get(_KEY).decode()


def _start_helper(world: int, timeout_s: float, attempts: int = 3) -> tuple[int, int]:
    """Start ``_coordinator.py``; its service port and lifeline port. A helper that dies
    before it is ready (a port taken between choosing and binding it) is replaced."""
    err = ""
    for _ in range(attempts):
        proc = subprocess.Popen(
            [sys.executable, str(_HELPER), str(world), str(_HEARTBEAT_S), str(max(1, int(timeout_s)))],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # Ctrl-C on the launcher must not kill it before the ranks exit
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
        ready, _, _ = select.select([proc.stdout], [], [], max(30.0, timeout_s))
        line = proc.stdout.readline() if ready else ""
        if line.startswith("READY "):
            _, port, lifeline = line.split()
            proc.stdout.close()
            return int(port), int(lifeline)
        proc.kill()
        err = f"exit code {proc.wait()}, output {line!r}"
    raise TpuRuntimeError(f"torchtpu: could not start the XLA coordination service ({_HELPER.name}: {err})")


def _local_address(host: str) -> str:
    """This machine's address on the route to ``host`` (no packet is sent)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 1))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _set_collective_timeout(timeout_s: float) -> None:
    """A hung peer blocks an XLA CPU collective until this flag's timeout (default 1800 s).
    XLA reads it only from XLA_FLAGS, only at the first client: the group's timeout
    unless the user set the flag."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _COLLECTIVE_TIMEOUT_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_COLLECTIVE_TIMEOUT_FLAG}={max(1, int(timeout_s))}".strip()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# -- programs over a group's devices -------------------------------------------------------
def group_devices(ranks: Sequence[int]) -> list[Any]:
    """The devices of global ranks ``ranks`` (one device per process), in that order."""
    rt = pjrt.get()
    if _cluster is None:
        if list(ranks) != [0]:
            raise TpuRuntimeError(f"torchtpu: a group of ranks {list(ranks)} needs the XLA distributed runtime")
        return [rt.device]
    by_id = {d.id: d for d in rt.client.devices()}
    return [by_id[_cluster.device_ids[r]] for r in ranks]


def compile_for_group(text: str, ranks: Sequence[int], what: str) -> pjrt.Executable:
    """Compile ``text`` in replica mode: replica ``i`` runs on global rank ``ranks[i]``."""
    rt = pjrt.get()
    devices = group_devices(ranks)
    opts = rt.compile_options([d.id for d in devices])
    t0 = time.perf_counter()
    try:
        exe = rt.client.compile_and_load(text, rt._jax.DeviceList(tuple(devices)), opts)
    except Exception as e:  # noqa: BLE001 - JaxRuntimeError / ValueError from the MLIR parser
        raise TpuRuntimeError(
            f"torchtpu: XLA could not compile the collective program for {what}: {str(e).strip()[:2000]}\n"
            "This is a torchtpu bug; please report it with the collective and shapes above."
        ) from e
    metrics.add("compiles")
    metrics.add("compile_seconds", time.perf_counter() - t0)
    return exe


# A collective op of our StableHLO text, with an all_reduce's region (its combiner), its
# attributes and its types: `%v6 = "stablehlo.all_reduce"(%v2) ({ ...region... }) {attrs} : (types) -> type`.
_COLLECTIVE = re.compile(
    r'"stablehlo\.(all_reduce|all_gather|all_to_all|collective_permute|reduce_scatter|collective_broadcast)"'
    r"\([^)]*\)\s*(?:\(\{(?P<region>.*?)\}\)\s*)?(?:<)?\{(?P<attrs>[^\n]*?)\}(?:>)?\s*:\s*(?P<types>[^\n]*)",
    re.DOTALL,
)
_COMBINER = re.compile(r'"stablehlo\.(\w+)"')


def collective_signature(text: str) -> list[str]:
    """The collectives of program ``text`` in program order: op (an all_reduce with its
    combiner), attributes (replica groups, dimensions) and types. What the ranks of a group
    must agree on; the rest of their programs may differ (a rank's own constants)."""
    out = []
    for m in _COLLECTIVE.finditer(text):
        combiner = _COMBINER.search(m.group("region") or "")
        op = m.group(1) + (f"({combiner.group(1)})" if combiner else "")
        out.append(f"{op} {{{m.group('attrs')}}} : {m.group('types').strip()}")
    return out


_agreements: dict[tuple[int, ...], int] = {}  # group -> programs agreed on so far


def agree_on_collectives(text: str, ranks: Sequence[int], what: str) -> None:
    """Check that every rank of ``ranks`` built a program with the same collectives as
    ``text`` for its next program over this group (the n-th program each rank builds for
    a group is compared with the others' n-th), through the distributed runtime's
    key-value store; raise ``CollectiveMismatchError`` on every rank that sees a difference
    or a peer that builds nothing within the group's timeout. One exchange per program
    built, none per run: a compiled function whose code or shapes depend on the rank
    fails here, with both descriptions, instead of mixing values or aborting in gloo."""
    c = _cluster
    if c is None or len(ranks) < 2 or not config.flag("TORCHTPU_DIST_CHECK"):
        return
    group = tuple(int(r) for r in ranks)
    n = _agreements.get(group, 0)
    _agreements[group] = n + 1
    prefix = f"torchtpu/programs/{'-'.join(map(str, group))}/{n}"
    mine = {"what": what, "collectives": collective_signature(text)}
    c.client.key_value_set(f"{prefix}/{c.rank}", json.dumps(mine))
    wait_ms = max(1000, int(c.timeout_s * 1000))
    theirs = {c.rank: mine}
    for r in group:
        if r == c.rank:
            continue
        try:
            theirs[r] = json.loads(c.client.blocking_key_value_get(f"{prefix}/{r}", wait_ms))
        except pjrt.get()._jax.JaxRuntimeError as e:
            raise CollectiveMismatchError(
                f"torchtpu: rank {r} built no program number {n} for group {list(group)} within {c.timeout_s:g}s, "
                f"while rank {c.rank} built {what} with {len(mine['collectives'])} collective(s): every rank of a "
                "group must compile the same graphs in the same order (a rank-dependent branch, shape or recompile "
                f"makes them differ; set TORCHTPU_DIST_CHECK=0 to skip this check). ({_first_line(e)})"
            ) from e
    if any(t["collectives"] != mine["collectives"] for t in theirs.values()):
        raise CollectiveMismatchError(_mismatch_message(group, theirs))


def _mismatch_message(group: tuple[int, ...], programs: dict[int, dict[str, Any]]) -> str:
    """Which collective differs first, and each rank's version of it."""
    sigs = {r: p["collectives"] for r, p in programs.items()}
    longest = max(len(s) for s in sigs.values())
    first = next(i for i in range(longest) if len({tuple(s[i:i + 1]) for s in sigs.values()}) > 1)
    lines = [
        f"  rank {r}: {programs[r]['what']}, {len(sigs[r])} collective(s); "
        f"collective {first}: {sigs[r][first] if first < len(sigs[r]) else '(none)'}"
        for r in sorted(sigs)
    ]
    return (
        f"torchtpu: the ranks of group {list(group)} compiled programs with different collectives, which cannot "
        "run together:\n" + "\n".join(lines) + "\nEvery rank must run the same compiled code with the same shapes "
        "and dtypes (look for code or shapes that depend on the rank; set TORCHTPU_DIST_CHECK=0 to skip this check)."
    )


_group_programs: OrderedDict[tuple[str, tuple[int, ...]], pjrt.Executable] = OrderedDict()


def group_executable(key: str, text: str, ranks: Sequence[int], what: str) -> pjrt.Executable:
    """The executable of program ``text`` (``key``: its cache key) over ``ranks``. Kept
    apart from the single-device executable cache (which loads from disk by key alone),
    least recently used dropped beyond TORCHTPU_MAX_EXECUTABLES and compiled again when
    next run: compiling is local to the process, only running meets the peers."""
    k = (key, tuple(ranks))
    exe = _group_programs.get(k)
    if exe is None:
        exe = _group_programs[k] = compile_for_group(text, ranks, what)
        while len(_group_programs) > int(config.get("TORCHTPU_MAX_EXECUTABLES")):
            _group_programs.popitem(last=False)
    else:
        _group_programs.move_to_end(k)
    return exe


_FAILED = "a collective program"


def run_for_group(exe: pjrt.Executable, args: Sequence[pjrt.Buffer], what: str = _FAILED) -> list[pjrt.Buffer]:
    """Run a group program with this rank's buffers and wait for it: a failure (dead
    peer, timeout) is raised here, where the caller can name the collective (``what``)."""
    outs = launch_for_group(exe, args, what)
    wait_for_group(outs, what)
    return outs


def launch_for_group(exe: pjrt.Executable, args: Sequence[pjrt.Buffer], what: str = _FAILED) -> list[pjrt.Buffer]:
    """Enqueue a group program with this rank's buffers; its outputs at once. The device
    runs programs with collectives in launch order, so every rank's collectives meet in
    the order each rank launched them."""
    rt = pjrt.get()
    try:
        result = exe.execute_sharded(list(args))
        outs = [o[0] for o in result.disassemble_into_single_device_arrays()]
    except rt._jax.JaxRuntimeError as e:
        raise _failure(what, e) from e
    metrics.add("executions")
    return outs


def wait_for_group(outs: Sequence[pjrt.Buffer], what: str = _FAILED) -> None:
    """Block until a launched group program's outputs are ready (the GIL is released);
    raise ``CollectiveError`` if it failed (a dead peer, a timeout)."""
    rt = pjrt.get()
    try:
        rt._jax.batched_block_until_ready(list(outs))
    except rt._jax.JaxRuntimeError as e:
        raise _failure(what, e) from e


def _failure(what: str, e: BaseException) -> CollectiveError:
    if what == _FAILED:
        return CollectiveError(f"torchtpu: a collective program failed: {_first_line(e)}")
    return CollectiveError(
        f"torchtpu: {what} failed in a collective (a peer process died, hung or did not run the same program): "
        f"{_first_line(e)}"
    )


def ready(outs: Sequence[pjrt.Buffer]) -> bool:
    """Whether a launched group program has finished (successfully or not)."""
    try:
        return all(pjrt.Runtime.is_ready(o) for o in outs)
    except Exception:  # noqa: BLE001 - is_ready raises the program's error: it has finished
        return True


def zeros(shape: Sequence[int], dtype: np.dtype) -> pjrt.Buffer:
    """A device buffer of zeros (the stand-in input of a rank that sends nothing)."""
    return pjrt.get().put(np.zeros(tuple(shape), dtype))
