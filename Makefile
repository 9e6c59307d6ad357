# Every target creates .venv from requirements.txt on first use (and again when it changes).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install demo test test-fast test-tpu docs experiments bench bench-accel clean
EXPERIMENTS ?= --all
WORKERS ?= 2

# The bytecode is compiled once, on every core (compileall): where PYTHONDONTWRITEBYTECODE=1 is set
# (as on the development machine), imports never write it, and every process (notebook kernels, subprocess
# runs, workers) would compile JAX's sources again (about 6 s each on 2 cores).
$(VENV)/.installed: requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -m compileall -q -j 0 $(VENV)/lib diloco_core analysis > /dev/null
	touch $@

install: $(VENV)/.installed  ## .venv from the pinned requirements.txt and this package (editable), nothing run

demo: $(VENV)/.installed  ## the main job: DP vs DiLoCo vs Streaming on the built-in data
	$(PY) -m diloco_core.compare --out runs/compare --overwrite

test: $(VENV)/.installed  ## the whole test suite (doctests included), 2 workers
	$(PY) -m pytest -n 2 -q --durations=30 $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

test-fast: $(VENV)/.installed  ## everything but the tests marked slow
	$(PY) -m pytest -n 2 -q -m "not slow" $(PYTEST_ARGS)

# The accelerator lane: one process (no xdist), on the device JAX finds, matmuls at "highest" precision.
# On a TPU machine whose Python has JAX with libtpu: `make test-tpu PY=python3` (no .venv is made then).
test-tpu: $(if $(filter $(VENV)/bin/python,$(PY)),$(VENV)/.installed)  ## the tests that say something about an accelerator
	JAX_PLATFORMS= JAX_DEFAULT_MATMUL_PRECISION=highest $(PY) -m pytest -p no:xdist -q --accelerator-lane tests $(PYTEST_ARGS)

docs: $(VENV)/.installed  ## the site from scratch, every notebook executed, warnings are errors
	$(PY) docs/build.py

experiments: $(VENV)/.installed  ## train and store the docs' experiments (analysis/results/*.json)
	$(PY) -m analysis experiments run $(EXPERIMENTS) --workers $(WORKERS)

bench: $(VENV)/.installed  ## benchmarks that print measured ratios
	$(PY) benchmarks/step_time.py
	$(PY) benchmarks/mesh_scaling.py
	$(PY) benchmarks/sweep_reuse.py
	$(PY) benchmarks/elastic_path.py

bench-accel: $(if $(filter $(VENV)/bin/python,$(PY)),$(VENV)/.installed)  ## accelerator benchmark, stored with provenance (PY=python3 on a TPU machine; ARGS=--quick on CPU)
	$(PY) benchmarks/accelerator.py --store --trace runs/bench_accel_trace $(ARGS)

clean:
	rm -rf _build runs .cache
