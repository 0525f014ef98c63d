"""Builds torchtpu's optional C++ extensions (torchtpu/csrc/): the device's hooks, the
fast paths of tensor creation and the device memory counters; everything else is in
pyproject.toml.

The extensions compile against the installed torch's headers, so they are built only where
torch imports at build time (``pip install --no-build-isolation``, as the Makefile runs it)
and a C++ compiler is found. Without them torchtpu installs and works the same, with Python
in their place: the fast paths' Python twins (slower), and Python hooks, with which
``torch.Generator(device="tpu")`` and pinned host memory raise.
"""

from setuptools import Extension, setup


def extensions() -> list[Extension]:
    try:
        import torch
        from torch.utils.cpp_extension import include_paths, library_paths
    except ImportError:  # an isolated build environment: no torch to compile against
        return []

    def extension(name: str, source: str, libraries: list[str]) -> Extension:
        return Extension(
            name,
            [source],
            include_dirs=include_paths(),
            library_dirs=library_paths(),
            libraries=libraries,
            extra_compile_args=["-std=c++17", "-O2", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"],
            language="c++",
            optional=True,  # no compiler: install without it
        )

    # plain C against Python alone: torch.tpu.memory_allocated's counters (torchtpu/runtime/memory.py)
    counters = Extension("torchtpu.runtime._counters", ["torchtpu/csrc/counters.c"], extra_compile_args=["-O2"], optional=True)

    return [
        extension("torchtpu._hooks", "torchtpu/csrc/hooks.cpp", ["c10", "torch_cpu"]),
        # tensor creation and compiled-graph argument keys (torchtpu/tensor/storage.py)
        extension("torchtpu.tensor._fast", "torchtpu/csrc/fast.cpp", ["c10", "torch_cpu", "torch_python"]),
        counters,
    ]


setup(ext_modules=extensions())
