# posenc: two entry points.
#   make demo  - install and run the main job
#   make test  - install with test extras and run the test suite
# torch==2.13.0 is installed first and explicitly: on the project's machines that resolves to a
# local CPU wheel, while a bare `torch` requirement in a fresh venv would download CUDA builds.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
OUT    ?= out

.PHONY: venv install install-test test test-all demo clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)

venv: $(PY)

install: $(PY)
	$(PY) -m pip install -q -e .

install-test: $(PY)
	$(PY) -m pip install -q -e ".[test]"

test: install-test
	$(PY) -m pytest -q

demo: install
	$(VENV)/bin/posenc list
	$(VENV)/bin/posenc example

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
