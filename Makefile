# Two commands: `make run` (install, fetch the default models, serve) and `make test`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
MODEL ?= smollm2-135m-instruct
EMBEDDING_MODEL ?= all-minilm-l6-v2
VENV := .venv
BIN := $(VENV)/bin
OIDC_PROVIDER := tests/oidc/node_modules/.installed

.PHONY: run test model install install-dev bench loadtest clean FORCE

run: install model
	$(BIN)/serge serve

# The suite on every core, at most 4 (pytest-xdist): a test module stays on one worker (its module fixtures made
# once), and each worker's torch and engine threads are its share of the cores (tests/conftest.py). Files go
# out costliest first, by their seconds in the last run (tests/scheduling.py; xdist's own order is by count).
# TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= $(shell n=$$(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc); echo $$(( n < 4 ? n : 4 )))

# Then the greedy-equality tests again in one process on 2 threads, as `serve` runs them (each worker above has
# one): llama.cpp sums a lone reply's attention in per-thread parts past 256 cells, which one thread never shows.
TWO_THREAD_TESTS := tests/test_batching.py tests/test_shared_prefix_real.py

test: install-dev model $(OIDC_PROVIDER)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)
	OMP_NUM_THREADS=2 SERGE_TORCH_THREADS=2 $(BIN)/python -m pytest -q -p no:cacheprovider $(TWO_THREAD_TESTS)

# npm's oidc-provider, pinned, for the OpenID Connect sign-in test in Chromium (tests/oidc); without npm that
# test is skipped and says why.
$(OIDC_PROVIDER): tests/oidc/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix tests/oidc --no-audit --no-fund --silent && touch $@; \
	else echo "npm is not installed: the OpenID Connect browser test will be skipped"; fi

bench: install-dev model
	$(BIN)/python -m pip install --quiet -e ".[dev,bench]"
	$(BIN)/python -m bench $(BENCH_ARGS)
	$(BIN)/python -m bench.schema_cost
	$(BIN)/python -m bench.dialects
	$(BIN)/python -m bench.embeddings
	$(BIN)/python -m bench.knowledge
	$(BIN)/python -m bench.agents
	$(BIN)/python -m bench.long_chat --open-first 60
	$(BIN)/python -m bench.quant_quality

# 50 people on the chat API and /v1 for a few minutes; exits 1 when a reply is lost or
# doubled, one is left streaming, or threads or memory do not come back (bench/README.md).
loadtest: install-dev model
	$(BIN)/python -m bench.loadtest $(LOADTEST_ARGS)

model: install
	$(BIN)/serge models pull $(MODEL)
	$(BIN)/serge models pull $(EMBEDDING_MODEL)

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

$(VENV)/.venv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	touch $@

# The transformers engine (torch, accelerate: the `serge[transformers]` extra) goes in only where it is wanted: an
# NVIDIA GPU with a CUDA toolkit (scripts/llama_build.py's CUDA build: the GPU path of safetensors models),
# SERGE_ENGINE=transformers, or TRANSFORMERS=yes; TRANSFORMERS=no leaves it out. The llama.cpp engine and the
# bundled models need neither: the default venv has no torch (sizes: docs/install.md). `make test` always has it.
TRANSFORMERS ?= auto

# torch goes in first and alone: a bare `torch` requirement would pull a multi-GB CUDA build.
$(VENV)/.torch: $(VENV)/.venv
	$(BIN)/python -m pip install "$(TORCH)"
	touch $@

# llama-cpp-python compiles llama.cpp from source the first time (~5 min on 2 idle cores; longer
# with CUDA). scripts/llama_build.py chooses the build and says why: CUDA where a CUDA toolkit is,
# Metal on Apple Silicon, else the CPU; your own CMAKE_ARGS win. Its multimodal library (mtmd) is
# built in, so a vision GGUF's mmproj runs too. pip keeps each build's wheel in its cache, in a
# folder named for its flags (pip keys a wheel by its URL alone), so later installs take seconds.
# The stamp holds the build's name: when the choice changes (a toolkit installed since, other
# CMAKE_ARGS, mtmd added to a venv built without it), it is built again.
$(VENV)/.llama: $(VENV)/.venv FORCE
	@build=$$($(BIN)/python scripts/llama_build.py --shell) || exit 1; eval "$$build"; \
	if [ -f $@ ] && [ "$$(cat $@)" = "$$LLAMA_BUILD" ]; then exit 0; fi; \
	cache=""; if [ -n "$$LLAMA_BUILD" ] && dir=$$($(BIN)/python -m pip cache dir 2>/dev/null); then \
	  cache="--cache-dir=$$dir/serge-llama/$$LLAMA_BUILD"; fi; \
	again=""; if $(BIN)/python -c "import llama_cpp" 2>/dev/null; then again="--force-reinstall --no-deps"; \
	  else echo "Compiling llama.cpp for the llama.cpp engine (once; about 5 minutes on 2 idle cores) ..."; fi; \
	set -x; CMAKE_BUILD_PARALLEL_LEVEL=$$(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc) CMAKE_ARGS="$$CMAKE_ARGS" \
	  $(BIN)/python -m pip install --progress-bar on $$cache $$again "$$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)" \
	  && echo "$$LLAMA_BUILD" > $@

FORCE:

# The rest of the dependencies through uv (from PyPI, into this venv): it resolves and fetches them in parallel,
# ~12 s for the dev extra here where pip took ~45 s. What pip put in first (torch, llama-cpp-python) satisfies
# the requirements and is kept; --compile-bytecode writes the .pyc files pip would have written.
$(BIN)/uv: $(VENV)/.venv
	$(BIN)/python -m pip install --quiet uv
	touch $@

UV_INSTALL = $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python

$(VENV)/.installed: pyproject.toml $(VENV)/.llama $(BIN)/uv
	@want="$(TRANSFORMERS)"; if [ "$$want" = auto ]; then want=no; \
	  if [ "$$SERGE_ENGINE" = transformers ]; then want=yes; \
	  elif $(BIN)/python scripts/llama_build.py --shell 2>/dev/null | grep -q '^LLAMA_BUILD=cuda'; then want=yes; fi; fi; \
	extra=""; if [ "$$want" = yes ]; then $(MAKE) --no-print-directory $(VENV)/.torch || exit 1; extra="[transformers]"; \
	  echo "Installing Serge with the transformers engine (serge[transformers]: torch, accelerate) ..."; \
	else echo "Installing Serge with the llama.cpp engine alone (no torch; TRANSFORMERS=yes adds the transformers engine)"; fi; \
	set -x; $(UV_INSTALL) -e ".$$extra"
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.torch $(VENV)/.llama $(BIN)/uv
	$(UV_INSTALL) -e ".[dev]"
	touch $@ $(VENV)/.installed

clean:
	rm -rf $(VENV) .venv-run build *.egg-info
