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

# Not -march=native: it turns on AMX too, and here the kernel refuses AMX tiles (illegal instruction
# in decode). The AVX-512 extensions the CPU reports are turned on one by one instead: on these
# machines they double prompt evaluation (Qwen 0.5B Q4_0, 128-token blocks: 87 -> 128 tokens/s).
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
cpu_has = $(if $(filter-out $(CPU_FLAGS),$(1)),,-D$(2)=ON)
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF \
  $(call cpu_has,avx512f avx512cd avx512vl avx512dq avx512bw,GGML_AVX512) \
  $(call cpu_has,avx512f avx512_vnni,GGML_AVX512_VNNI) \
  $(call cpu_has,avx512f avx512vbmi,GGML_AVX512_VBMI) \
  $(call cpu_has,avx512f avx512_bf16,GGML_AVX512_BF16) \
  $(call cpu_has,avx_vnni,GGML_AVX_VNNI)
# The llama-cpp-python requirement as pyproject.toml pins it (one place to change it).
export LLAMA_REQUIREMENT := import tomllib; print(next(d for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if d.startswith("llama-cpp-python")))

.PHONY: install run demo test test-fast lint browser bench clean-venv

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required (set PYTHON=python3.11)")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: a plain `torch` requirement pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	# llama-cpp-python compiles from source, for this CPU (LLAMA_CMAKE_ARGS below), never from a
	# wheel cached by an earlier build with other flags.
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install --no-cache-dir --progress-bar on \
	  "$$($(BIN)/python -c "$$LLAMA_REQUIREMENT")"
	$(BIN)/python -m pip install --progress-bar on -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/rag demo

run: demo
	# No file watcher: it would watch .venv too (thousands of inotify events under load).
	$(BIN)/streamlit run app.py --server.port $(PORT) --server.fileWatcherType none

lint: install
	$(BIN)/ruff check rag tests pages app.py db
	$(BIN)/mypy

# The browser tests drive Debian's Chromium (Playwright's own browser download does not work
# offline): install it when missing and we can, else stop at once with the command to run.
browser:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "Installing Chromium for the browser tests (apt-get install chromium chromium-driver)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && command -v apt-get >/dev/null 2>&1; then \
	    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else \
	    echo "The browser tests need Chromium. Run:  sudo apt-get install chromium chromium-driver  (then make test)"; \
	    exit 1; \
	  fi; }

# Every test: a bare `pytest` deselects the slow (real-model) and browser tests; `-m ""` runs all.
test: lint browser
	$(BIN)/pytest -m ""

test-fast: install
	$(BIN)/pytest -m "not slow and not browser"

bench: install
	$(BIN)/rag bench

clean-venv:
	rm -rf $(VENV)
