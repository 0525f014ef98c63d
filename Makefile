# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.torchtpu-installed

.PHONY: demo test test-all test-ops test-models test-models-defer test-models-compile test-models-bf16 test-examples docs bench lint clean

# torch first, then torchtpu without build isolation: its C++ hooks (setup.py) compile
# against the torch in the venv (an isolated build would fetch another torch).
TORCH_PIN := $(shell grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')
$(STAMP): pyproject.toml setup.py $(wildcard torchtpu/csrc/*.cpp torchtpu/csrc/*.c)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "setuptools>=70.1" "$(TORCH_PIN)"
	$(PY) -m pip install -q --no-build-isolation -e ".[dev,hf,jax,docs,ecosystem]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/train_mlp.py

# The default suite, in one worker process per core (pytest-xdist): 14-15 minutes on CI's
# 2 cores (842-933 s measured; its budget is 15), more in one process. TEST_JOBS=0 runs it
# in this process. pytest's exit code 5 ("no tests collected") is turned into a failure.
TEST_JOBS ?= auto
test: $(STAMP)
	$(PY) -m pytest tests -q -m "not slow" -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile --durations=25; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; exit $$rc

# Everything, including the long suites.
test-all: $(STAMP)
	$(PY) -m pytest tests -q -p no:cacheprovider; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; exit $$rc

# The whole OpInfo conformance run (every dtype, in-place and out= variants, gradients,
# every sample; long), in 8 processes (one slice of op_db each), the compiled OpInfo run,
# every ModuleInfo sample in every way (tests/test_moduleinfo.py) and common_nn test
# (tests/test_nn_tests.py), every OptimizerInfo config
# eagerly, under DeferAndFuse and compiled (tests/test_optiminfo.py), then the coverage report.
test-ops: $(STAMP)
	$(PY) -m pytest tests/test_core_ops.py -q -p no:cacheprovider; rc1=$$?; \
	$(PY) -m torchtpu.testing.shards 8; rc2=$$?; \
	$(PY) -m pytest tests/test_opinfo_compile.py -q -p no:cacheprovider -m slow; rc3=$$?; \
	$(PY) -m pytest tests/test_moduleinfo.py tests/test_nn_tests.py -q -p no:cacheprovider -m slow; rc4=$$?; \
	$(PY) -m pytest tests/test_optiminfo.py -q -p no:cacheprovider -m slow; rc5=$$?; \
	$(PY) -m torchtpu.coverage --from build/opinfo-full.json --markdown build/coverage.md > /dev/null || true; \
	if [ $$rc1 -ne 0 ]; then exit $$rc1; fi; if [ $$rc2 -ne 0 ]; then exit $$rc2; fi; if [ $$rc3 -ne 0 ]; then exit $$rc3; fi; \
	if [ $$rc4 -ne 0 ]; then exit $$rc4; fi; exit $$rc5

# Every model of the zoo (tests/models) against the CPU, every attention implementation:
# prints the pass table and writes it to docs/models.md; fails on an unexpected result.
test-models: $(STAMP)
	cd tests && $(abspath $(PY)) models/report.py --markdown ../docs/models.md

# The same zoo with the tpu side under DeferAndFuse (every model's forward, backward and
# step recorded and run as fused graphs): prints the pass table; fails on an unexpected result.
test-models-defer: $(STAMP)
	cd tests && TORCHTPU_DEFER_AND_FUSE=1 $(abspath $(PY)) models/report.py

# The same zoo with the tpu model's forward (so its backward) and SGD step under
# torch.compile(backend="tpu"), the library's default attention: prints the pass table.
test-models-compile: $(STAMP)
	cd tests && $(abspath $(PY)) models/report.py --compile --attn default

# The same zoo in bfloat16 (weights and inputs) and under torch.autocast(bfloat16) with
# CUDA's policy on both sides: each tensor's error to float64 against the CPU's; writes
# docs/models-bfloat16.md and docs/models-autocast.md.
test-models-bf16: $(STAMP)
	cd tests && $(abspath $(PY)) models/report.py --precision bfloat16 --attn default --markdown ../docs/models-bfloat16.md; rc1=$$?; \
	$(abspath $(PY)) models/report.py --precision autocast --attn default --markdown ../docs/models-autocast.md; rc2=$$?; \
	if [ $$rc1 -ne 0 ]; then exit $$rc1; fi; exit $$rc2

# Every example (examples/<name>/) at --size tiny --compare, in every mode, against the CPU.
test-examples: $(STAMP)
	$(PY) -m pytest tests/test_examples.py -q -p no:cacheprovider -n $(TEST_JOBS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; exit $$rc

# The user guide (docs/notebooks/, marimo): runs every notebook headless, each checking what it
# shows against PyTorch on the CPU; writes build/docs/<name>.html, stops at the first failing one.
docs: $(STAMP)
	$(PY) docs/notebooks/export.py

bench: $(STAMP)
	$(PY) benchmarks/bench_eager.py

lint: $(STAMP)
	$(PY) -m ruff check torchtpu tests benchmarks examples docs/notebooks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
