# Two commands: `make run` (app on the demo corpus) and `make test` (the whole suite).
# Both create .venv and install everything on first use; nothing is fetched at run time.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PORT ?= 8501

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install run demo test test-fast lint bench clean-venv

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required (set PYTHON=python3.11)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: a plain `torch` requirement pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	# llama-cpp-python compiles from source; a native (-march=native) build crashes in decode here.
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/rag demo

run: demo
	$(BIN)/streamlit run app.py --server.port $(PORT)

lint: install
	$(BIN)/ruff check rag tests pages app.py db
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

test-fast: install
	$(BIN)/pytest -m "not slow and not browser"

bench: install
	$(BIN)/rag bench

clean-venv:
	rm -rf $(VENV)
