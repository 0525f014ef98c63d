"""The executable cache every path compiles through: in memory, then on disk.

``compile(text, what)`` returns a loaded executable for a StableHLO module. Entries are
keyed by a hash of the program text, the jaxlib version, the platform and the compile
options, so a program compiled by one process (or an earlier run of the same script) is
loaded instead of compiled.

The disk layer (``TORCHTPU_CACHE_DIR``; empty disables it) stores *data*: a header, a
SHA-256 of the payload and the serialized executable. A truncated or corrupted entry
fails its checksum, is ignored and rewritten. Writes go to a temporary file renamed into
place, so readers never see half an entry. Processes that miss on the same entry at the
same time (two ranks of one job) take a lock file: one compiles and writes, the others
wait for its entry and load it.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from .. import _spans, config, metrics
from . import pjrt

_MAGIC = b"TTPUXEX1"
_HEADER = struct.Struct("<8s32sQ")  # magic, sha256(payload), payload length
_LOCK_WAIT_S = 120.0  # how long to wait for another process compiling the same program

# Live executables, least recently used first. The oldest are dropped beyond
# TORCHTPU_MAX_EXECUTABLES, and also when the process nears the kernel's limit on memory
# maps (``_relieve_map_pressure``); a dropped one comes back from the disk cache, or is
# compiled again, when needed.
_memory: OrderedDict[str, Any] = OrderedDict()

# Each XLA CPU executable maps its code in about 10 memory regions (a single op) to 20 (a
# fused graph of a model's step), measured on jaxlib 0.10.2. 4096 of them can pass Linux's
# default vm.max_map_count (65530): XLA's next compile then fails to map its code and the
# process dies (seen running the model zoo under DeferAndFuse). So every MAP_CHECK_EVERY new
# executables the map count is read, and above MAP_HIGH of the limit the least recently
# used executables go until the estimate is under MAP_LOW.
MAP_CHECK_EVERY = 64
MAP_HIGH, MAP_LOW = 0.5, 0.35
_since_map_check = 0


def cache_dir() -> Path | None:
    """The on-disk cache directory for this platform and jaxlib, or None when disabled."""
    raw = os.environ.get("TORCHTPU_CACHE_DIR")
    if raw is None:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torchtpu"
    elif raw.strip() == "":
        return None
    else:
        base = Path(raw)
    rt = pjrt.get()
    return base / f"{rt.platform}-jaxlib{rt.runtime_version}"


def program_key(text: str) -> str:
    rt = pjrt.get()
    h = hashlib.sha256()
    for part in (rt.platform, rt.runtime_version, rt.compile_options_fingerprint(), text):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile(text: str, what: str) -> Any:  # noqa: A001 - the natural name
    """A loaded executable for ``text`` (memory cache, then disk, then XLA)."""
    return compile_keyed(text, what)[1]


def compile_keyed(text: str, what: str) -> tuple[str, Any]:
    """``(key, executable)``: callers that run a program often keep the key and fetch the
    executable with :func:`get` each time, so that only this cache holds executables."""
    key = program_key(text)
    exe = get(key)
    if exe is not None:  # another call compiled the same program text
        metrics.add("memory_cache_hits")
        if _spans.explain is not None:
            _spans.explain.served(what, "memory")
        with _spans.maybe_span("torchtpu::compile (memory)", program=what, tier="memory"):
            return key, exe
    directory = cache_dir()
    exe = _load_or_compile(directory, key, text, what) if directory is not None else _compile_now(text, what)
    _memory[key] = exe
    _evict_beyond(int(config.get("TORCHTPU_MAX_EXECUTABLES")))
    _relieve_map_pressure()
    return key, exe


def _evict_beyond(limit: int) -> None:
    """Drop the least recently used executables until at most ``limit`` are live."""
    while len(_memory) > max(limit, 1):
        pjrt.get().forget(_memory.popitem(last=False)[1])
        metrics.add("executables_evicted")


def map_count() -> int | None:
    """Memory maps of this process (Linux; None elsewhere)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def max_map_count() -> int | None:
    """The kernel's limit on a process's memory maps (Linux; None elsewhere)."""
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return None


def _relieve_map_pressure() -> None:
    """Every MAP_CHECK_EVERY new executables: above MAP_HIGH of the map limit, drop the
    least recently used executables in proportion, down to about MAP_LOW of it."""
    global _since_map_check
    _since_map_check += 1
    if _since_map_check < MAP_CHECK_EVERY:
        return
    _since_map_check = 0
    used, limit = map_count(), max_map_count()
    if used is None or not limit or used <= MAP_HIGH * limit:
        return
    keep = int(len(_memory) * MAP_LOW * limit / used)  # maps scale with live executables
    metrics.add("map_pressure_evictions")
    _evict_beyond(keep)


def fetch(key: str, text: str, what: str) -> Any:
    """The executable of a program compiled before as ``key``: from memory, or (after an
    eviction) from disk or XLA again. The key derives from ``text``, so it stays valid."""
    exe = get(key)
    return exe if exe is not None else compile_keyed(text, what)[1]


def get(key: str) -> Any:
    """The live executable for ``key`` (marking it recently used), or None if evicted."""
    exe = _memory.get(key)
    if exe is not None:
        _memory.move_to_end(key)
    return exe


def clear_memory() -> None:
    """Forget the in-memory layer (the disk layer stays): the next use reloads or recompiles."""
    for exe in _memory.values():
        pjrt.get().forget(exe)
    _memory.clear()


def _compile_now(text: str, what: str) -> Any:
    t0 = time.perf_counter()
    with _spans.maybe_span("torchtpu::compile (compiled)", program=what, tier="compiled"):
        exe = pjrt.get().compile(text, what)
    if _spans.explain is not None:
        _spans.explain.served(what, "compiled")
    metrics.add("compiles")
    metrics.add("compile_seconds", time.perf_counter() - t0)
    if config.flag("TORCHTPU_LOG_COMPILES"):
        print(f"[torchtpu] compiled {what} in {1e3 * (time.perf_counter() - t0):.1f} ms")
    return exe


def _load_or_compile(directory: Path, key: str, text: str, what: str) -> Any:
    path = directory / f"{key}.xex"
    exe = _read(path, what)
    if exe is not None:
        return exe
    lock = _try_lock(directory, key)
    if lock is None:  # another process is compiling it: wait for its entry
        exe = _wait_for(path, directory / f"{key}.lock", what)
        if exe is not None:
            return exe
    try:
        exe = _compile_now(text, what)
        _write(path, exe)
    finally:
        if lock is not None:
            _unlock(lock)
    return exe


def _read(path: Path, what: str = "program") -> Any:
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    t0 = time.perf_counter()
    payload = _verified_payload(blob)
    if payload is None:
        metrics.add("disk_cache_corrupt")
        return None
    try:
        with _spans.maybe_span("torchtpu::compile (disk)", program=what, tier="disk"):
            exe = pjrt.get().deserialize(payload, what)
    except Exception:  # noqa: BLE001 - a stale or foreign entry: recompile and overwrite it
        metrics.add("disk_cache_corrupt")
        return None
    if _spans.explain is not None:
        _spans.explain.served(what, "disk")
    metrics.add("disk_cache_hits")
    metrics.add("disk_load_seconds", time.perf_counter() - t0)
    return exe


def _verified_payload(blob: bytes) -> bytes | None:
    if len(blob) < _HEADER.size:
        return None
    magic, digest, length = _HEADER.unpack_from(blob)
    payload = blob[_HEADER.size :]
    if magic != _MAGIC or length != len(payload) or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


def _write(path: Path, exe: Any) -> None:
    try:
        payload = pjrt.get().serialize(exe)
    except Exception:  # noqa: BLE001 - some platforms cannot serialize; stay memory-only
        return
    blob = _HEADER.pack(_MAGIC, hashlib.sha256(payload).digest(), len(payload)) + payload
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(blob)
        os.replace(tmp, path)  # atomic: readers see the old entry or the whole new one
        metrics.add("disk_cache_writes")
    except OSError:
        tmp.unlink(missing_ok=True)  # a read-only or full disk only costs the cache


def _try_lock(directory: Path, key: str) -> Path | None:
    lock = directory / f"{key}.lock"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        if _stale(lock):
            lock.unlink(missing_ok=True)
            return _try_lock(directory, key)
        return None
    except OSError:
        return Path(os.devnull)  # cannot lock (read-only dir): compile without coordination
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return lock


def _stale(lock: Path) -> bool:
    """A lock whose owner died (or that is older than the wait limit) is stale."""
    try:
        pid = int(lock.read_text() or "0")
        age = time.time() - lock.stat().st_mtime
    except (OSError, ValueError):
        return True
    if age > _LOCK_WAIT_S:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _unlock(lock: Path) -> None:
    if str(lock) != os.devnull:
        lock.unlink(missing_ok=True)


def _wait_for(path: Path, lock: Path, what: str) -> Any:
    deadline = time.monotonic() + _LOCK_WAIT_S
    while time.monotonic() < deadline:
        if path.exists():
            exe = _read(path, what)
            if exe is not None:
                return exe
        if not lock.exists() or _stale(lock):
            return _read(path, what)
        time.sleep(0.01)
    return None
