"""The storage-program runner: the one layer that builds and runs XLA programs over storage
cells for eager, DeferAndFuse and torch.compile (``program.py``), with the device-side
checks they report (``checks.py``), the matmul precision baked into them
(``precision.py``) and the bounded caches that hold them (``bounded.py``).

It sits between ``eager/`` and ``tensor/``: it may import ``tensor``, ``lowering``,
``stablehlo`` and ``runtime``, never ``eager``, ``compile`` or the faces above them.
"""
