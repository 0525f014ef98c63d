"""Builds torchtpu's optional C++ hooks (torchtpu/csrc/hooks.cpp); everything else is in
pyproject.toml.

The extension compiles against the installed torch's headers, so it is built only where
torch imports at build time (``pip install --no-build-isolation``, as the Makefile runs it)
and a C++ compiler is found. Without it torchtpu installs and works the same, with Python
hooks in its place: ``torch.Generator(device="tpu")`` and pinned host memory then raise.
"""

from setuptools import Extension, setup


def hooks_extension() -> list[Extension]:
    try:
        import torch
        from torch.utils.cpp_extension import include_paths, library_paths
    except ImportError:  # an isolated build environment: no torch to compile against
        return []
    return [
        Extension(
            "torchtpu._hooks",
            ["torchtpu/csrc/hooks.cpp"],
            include_dirs=include_paths(),
            library_dirs=library_paths(),
            libraries=["c10", "torch_cpu"],
            extra_compile_args=["-std=c++17", "-O2", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"],
            language="c++",
            optional=True,  # no compiler: install without it
        )
    ]


setup(ext_modules=hooks_extension())
