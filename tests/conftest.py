import os
import sys
import tempfile

# Hermetic compile counts: every test run starts with its own, empty disk cache.
os.environ["TORCHTPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchtpu-test-cache-")

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
    # an asynchronous device-side error a test left pending must not fail the next test
    from torchtpu.runner import checks

    checks.clear()
