"""The coordination-service host: a small process that rank 0 starts for the XLA transport.

    python _coordinator.py NUM_NODES HEARTBEAT_S REGISTER_TIMEOUT_S

Run as a script (stdlib and jaxlib only, no torch, no torchtpu import: it starts in
~0.4 s). It starts jaxlib's coordination service on a free port, opens a *lifeline*
listening socket, prints ``READY <service port> <lifeline port>`` and then serves until
every rank that connected a lifeline has closed it. A rank's lifeline closes when its
process ends, however it ends (exit, exception, SIGKILL), so the service outlives every
client -- the condition for survivors to get Python exceptions instead of SIGABRT:

- a client whose service disappears aborts its process after the heartbeat timeout
  (a C++ LOG(FATAL) that Python cannot intercept: jaxlib 0.10.2's
  ``missed_heartbeat_callback`` is unusable from Python), so the service must not live
  inside rank 0's worker, which may die first;
- a port already in use makes jaxlib segfault while starting the service: here that
  kills only this helper, and rank 0 retries with another port.
"""

from __future__ import annotations

import os
import select
import socket
import sys
import time


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _serve_lifelines(listener: socket.socket, num_nodes: int, register_timeout_s: float) -> None:
    """Return once every lifeline that connected has closed (and no more can come)."""
    deadline = time.monotonic() + register_timeout_s
    conns: list[socket.socket] = []
    seen = 0
    while True:
        accepting = seen < num_nodes and time.monotonic() < deadline
        if not accepting and not conns:
            return
        watch = [listener, *conns] if accepting else conns
        ready, _, _ = select.select(watch, [], [], 1.0)
        for s in ready:
            if s is listener:
                conn, _ = listener.accept()
                conns.append(conn)
                seen += 1
            elif not s.recv(64):  # EOF: that rank's process is gone
                conns.remove(s)
                s.close()


def main() -> None:
    num_nodes, heartbeat_s, register_timeout_s = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from jaxlib import _jax

    port = _free_port()
    service = _jax.get_distributed_runtime_service(
        f"[::]:{port}",
        num_nodes,
        heartbeat_timeout=heartbeat_s,
        cluster_register_timeout=register_timeout_s,
        shutdown_timeout=max(heartbeat_s, 10),
        recoverable=True,  # a dead task is reported to the others, it does not abort them
    )
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("", 0))
    listener.listen(num_nodes)
    print(f"READY {port} {listener.getsockname()[1]}", flush=True)
    _serve_lifelines(listener, num_nodes, register_timeout_s)
    service.shutdown()


if __name__ == "__main__":
    main()
