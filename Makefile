# Two commands: `make run` (install, fetch the default models, serve) and `make test`.
PYTHON ?= python3
TORCH ?= torch==2.13.0
MODEL ?= smollm2-135m-instruct
EMBEDDING_MODEL ?= all-minilm-l6-v2
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test model install install-dev bench loadtest clean

run: install model
	$(BIN)/serge serve

test: install-dev model
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: install-dev model
	$(BIN)/python -m pip install --quiet -e ".[dev,bench]"
	$(BIN)/python -m bench $(BENCH_ARGS)
	$(BIN)/python -m bench.schema_cost
	$(BIN)/python -m bench.embeddings

# 50 people on the chat API and /v1 for a few minutes; exits 1 when a reply is lost or
# doubled, one is left streaming, or threads or memory do not come back (bench/README.md).
loadtest: install-dev model
	$(BIN)/python -m bench.loadtest $(LOADTEST_ARGS)

model: install
	$(BIN)/serge models pull $(MODEL)
	$(BIN)/serge models pull $(EMBEDDING_MODEL)

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# torch goes in first and alone: a bare `torch` requirement would pull a multi-GB CUDA build.
$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install "$(TORCH)"
	touch $@

# llama-cpp-python compiles llama.cpp from source the first time (~5 min on 2 idle cores);
# pip keeps the built wheel in its cache, so later installs take seconds. Its multimodal
# library (mtmd, ~10% of the C++) is left out: Serge serves text models only.
$(VENV)/.llama: $(VENV)/.torch
	@$(BIN)/python -c "import llama_cpp" 2>/dev/null || echo "Compiling llama.cpp for the llama.cpp engine (once; about 5 minutes on 2 idle cores) ..."
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) CMAKE_ARGS="-DLLAVA_BUILD=OFF $$CMAKE_ARGS" $(BIN)/python -m pip install --progress-bar on "$$(grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)"
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.llama
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.llama
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@ $(VENV)/.installed

clean:
	rm -rf $(VENV) .venv-run build *.egg-info
