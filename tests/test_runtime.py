"""The PjRT adapter: platforms, XLA_FLAGS checks, the hidden jax lookup, autoload."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchtpu
from torchtpu.errors import TpuPlatformError
from torchtpu.runtime import platforms


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )


def test_adapter_smoke():
    from torchtpu.runtime import pjrt

    rt = pjrt.get()
    import numpy as np

    buf = rt.put(np.arange(4, dtype=np.float32))
    exe = rt.compile(
        'module @m { func.func public @main(%a: tensor<4xf32>) -> (tensor<4xf32>) {\n'
        '  %0 = "stablehlo.add"(%a, %a) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n'
        '  "func.return"(%0) : (tensor<4xf32>) -> () } }',
        "smoke",
    )
    handlers = rt.result_handlers([((4,), np.dtype(np.float32))])
    (out,), done = rt.execute(exe, [buf], handlers)
    rt.wait([done])
    assert rt.is_ready(out) and rt.to_numpy(out).tolist() == [0.0, 2.0, 4.0, 6.0]
    blob = rt.serialize(exe)
    (again,), _ = rt.execute(rt.deserialize(blob), [buf], handlers)
    assert rt.to_numpy(again).tolist() == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize(
    "dtype", ["float32", "float64", "int64", "int8", "uint8", "bool", "float16", "bfloat16", "complex64", "float8_e4m3fn"]
)
def test_to_numpy_reads_every_dtype_as_a_read_only_array(dtype: str) -> None:
    """On the cpu platform to_numpy reads a buffer's memory through the buffer protocol;
    a format numpy has none for (bfloat16, float8) takes the conversion. Either way: the
    values put, the dtype and shape, and an array nobody may write (programs read it)."""
    import ml_dtypes
    import numpy as np

    from torchtpu.runtime import pjrt

    rt = pjrt.get()
    np_dtype = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    if np_dtype == np.float64 and not rt.supports_f64:
        pytest.skip("no float64 on this platform")
    host = (np.arange(12) % 3).astype(np_dtype).reshape(3, 4)
    got = rt.to_numpy(rt.put(host))
    assert got.dtype == np_dtype and got.shape == (3, 4)
    assert got.tobytes() == host.tobytes()
    assert not got.flags.writeable


def test_to_numpy_waits_for_a_result_still_being_computed() -> None:
    x = torch.randn(1500, 1500)
    y = x.to("tpu")
    out = (y @ y).abs().sum()  # enqueued: its buffer is not ready yet
    from torchtpu.runtime import pjrt
    from torchtpu.tensor.storage import cell_of

    got = float(pjrt.get().to_numpy(cell_of(out).buf).reshape(-1)[0])
    expected = float((x @ x).abs().sum())
    assert got == pytest.approx(expected, rel=1e-4)


def test_claim_waits_for_readers_and_keeps_the_memory():
    """runner.program.claim: the storage's buffer becomes its own only after the programs
    already reading the old one ran (they see the old value), and on the cpu platform it is
    the same memory, writable through Runtime.host_memory."""
    from torchtpu.runner.program import claim
    from torchtpu.runtime import pjrt
    from torchtpu.tensor.storage import cell_of

    rt = pjrt.get()
    if rt.platform != "cpu":
        pytest.skip("a device buffer is host memory only on the cpu platform")
    a, w = torch.randn(600, 600), torch.randn(600, 600)
    x, wt = a.to("tpu"), w.to("tpu")
    y = x
    for _ in range(4):  # enqueued, reading x's buffer
        y = x @ wt + y
    cell = cell_of(x)

    def address() -> int:  # the view is dropped at once: it holds the buffer while it lives
        return torch.frombuffer(rt.host_memory(cell._buf, cell.nbytes), dtype=torch.float32).data_ptr()

    before = address()
    assert claim(cell)
    rt.block([cell._buf])
    memory = rt.host_memory(cell._buf, cell.nbytes)
    assert memory is not None and not memory.readonly and address() == before
    torch.frombuffer(memory, dtype=torch.float32).fill_(7.0)
    del memory
    expected = a
    for _ in range(4):
        expected = a @ w + expected
    torch.testing.assert_close(y.cpu(), expected, rtol=1e-4, atol=1e-3)
    assert torch.equal(x.cpu(), torch.full((600, 600), 7.0))
    held = cell._buf  # a second holder: not claimed, nothing changes
    assert not claim(cell) and cell._buf is held


def test_bad_program_text_is_a_python_error():
    from torchtpu.errors import TpuRuntimeError
    from torchtpu.runtime import pjrt

    with pytest.raises(TpuRuntimeError, match="could not compile"):
        pjrt.get().compile("this is not mlir", "garbage")


def test_unknown_platform_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TORCHTPU_PLATFORM", "abacus")
    with pytest.raises(TpuPlatformError, match="cpu, tpu, cuda"):
        platforms.choose()


@pytest.mark.parametrize("name", ["tpu", "cuda"])
def test_missing_plugin_is_a_clear_error(monkeypatch, name):
    monkeypatch.setenv("TORCHTPU_PLATFORM", name)
    monkeypatch.setenv("TORCHTPU_LIBTPU_PATH", "")
    monkeypatch.setenv("TORCHTPU_CUDA_PLUGIN_PATH", "")
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    if (name == "tpu" and platforms.libtpu_path()) or (name == "cuda" and platforms.cuda_plugin_path()):
        pytest.skip("plugin installed")
    with pytest.raises(TpuPlatformError, match="plugin was not found"):
        platforms.choose()


@pytest.mark.slow  # make test-all (moved out of make test's 15 minutes)
def test_plugin_path_that_does_not_load_is_a_clear_error():
    r = _run(
        """
        import torch
        try:
            torch.ones(1, device="tpu")
        except Exception as e:
            print(type(e).__name__, e)
        """,
        TORCHTPU_PLATFORM="cuda",
        TORCHTPU_CUDA_PLUGIN_PATH="/nonexistent/plugin.so",
    )
    assert "TpuPlatformError" in r.stdout and "not found" in r.stdout, r.stdout + r.stderr


def test_bad_xla_flags_raise_instead_of_aborting():
    r = _run(
        """
        import torch
        try:
            torch.ones(1, device="tpu")
        except Exception as e:
            print("RAISED", type(e).__name__, e)
        """,
        XLA_FLAGS="--xla_this_flag_does_not_exist=1",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "RAISED TpuPlatformError" in r.stdout and "XLA_FLAGS" in r.stdout


def test_import_is_cheap_and_training_never_imports_jax():
    r = _run(
        """
        import sys, torch
        assert "jaxlib" not in sys.modules, "jaxlib imported at import torch"
        m = torch.nn.Linear(4, 2).to("tpu")
        loss = m(torch.randn(3, 4, device="tpu")).square().mean()
        loss.backward()
        torch.optim.SGD(m.parameters(), lr=0.1).step()
        print(loss.item())
        print("JAX", "jax" in sys.modules, [k for k in sys.modules if (k == "jax" or k.startswith("jax.")) and sys.modules[k] is not None])
        """
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "JAX False []" in r.stdout


@pytest.mark.slow  # make test-all (moved out of make test's 15 minutes)
def test_autoload_can_be_disabled():
    r = _run(
        """
        import torch
        print(hasattr(torch, "tpu"))
        import torchtpu
        print(torch.ones(2, device="tpu").cpu().tolist())
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "[1.0,", "1.0]"]


def test_importing_torchtpu_before_torch_works():
    r = _run(
        """
        import torchtpu
        import torch
        print(torchtpu.get_eager_mode(), (torch.ones(2, device="tpu") + 1).cpu().tolist())
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["eager", "[2.0,", "2.0]"]


def test_platform_default_is_cpu():
    import torchtpu

    assert torchtpu.platform() == "cpu"
    assert torch.ones(1, device="tpu").device.type == "tpu"


def test_every_environment_variable_is_documented_in_the_readme():
    from torchtpu import config

    readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")).read()
    missing = [name for name in config.ENV_VARS if f"`{name}`" not in readme]
    assert not missing, f"document these in README.md's environment table: {missing}"


def test_synchronize_waits_for_every_execution_even_with_its_results_gone():
    """torch.tpu.synchronize() waits for every enqueued execution, as CUDA's waits for
    every kernel: one whose outputs were all dropped at once (``model(x)`` in a timing
    loop) too. Each is waited for through its runtime token, which holds no result (the
    donation checks count a buffer's references)."""
    from torchtpu.runner import program
    from torchtpu.runtime import pjrt

    x = torch.randn(64, 8, device="tpu")
    torch.tpu.synchronize()
    executions = torchtpu.metrics.snapshot()["executions"]
    values, indices = x.max(dim=1)  # one program, two results
    del values, indices
    assert torchtpu.metrics.snapshot()["executions"] == executions + 1
    pending = program.take_pending()
    assert len(pending) == 1 and program.take_pending() == []
    pjrt.get().wait(pending)


def test_the_executions_to_wait_for_stay_bounded():
    """Executions known to have finished are forgotten as the list grows: one with a ready
    result, and one whose results are gone when a later one has finished (the device runs
    its programs in order)."""
    from torchtpu.runner import program

    x = torch.randn(64, 8, device="tpu")
    torch.tpu.synchronize()
    for _ in range(3 * program._TRIM_AT):
        x + 1  # dropped at once
        y = x * 2  # kept until the next one
        y.cpu()  # ready
    assert len(program._pending) <= 2 * program._TRIM_AT
    torch.tpu.synchronize()
    assert program._pending == []
    torch.testing.assert_close(y.cpu(), x.cpu() * 2)
