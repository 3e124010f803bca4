# The two commands of the README, and the set-up they need, from a fresh clone:
#   make demo   record a real 4-rank run of the example trainer on CPU, ingest it, summarise it
#   make test   the whole test suite
# Both create .venv on first use. torch is installed only where it is missing: the CPU build
# 2.13.0 on a fresh machine; a GPU user's torch is left as it is.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.bprof-installed

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[capture,test]'
	touch $(STAMP)

demo: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" examples/demo.sh

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs
