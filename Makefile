# make reproduce: regenerate and check every document number (results/).
# make test: the test suite. Both create .venv and install the pinned versions first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install reproduce test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,plot,hf,jax]'
	touch $(STAMP)

reproduce: $(STAMP)
	$(PY) -m softcapgrad reproduce --out results

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench.py

clean:
	rm -rf $(VENV) .pytest_cache
