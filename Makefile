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
THREADS ?= 1

.PHONY: venv install install-test test test-all demo results clean

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
	$(PY) -m pytest -q -n auto

# The main job: every encoding's properties measured, the quick length-generalization
# benchmark (about 10 minutes on a 2-core CPU; an interrupted run resumes where it stopped),
# and one self-contained HTML report of both.
demo: install
	$(VENV)/bin/posenc list --short
	$(VENV)/bin/posenc check
	$(VENV)/bin/posenc bench --preset quick --threads $(THREADS) --out $(OUT)/bench --resume
	$(VENV)/bin/posenc report --out $(OUT)/report --bench $(OUT)/bench
	@echo "report: $(OUT)/report/report.html"

# Re-run every measurement behind a number in README.md and docs/ (about half an hour on a
# 2-core CPU), then re-render their tables from the results files in benchmarks/results/.
results: install-test
	$(PY) benchmarks/tables.py --rerun

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
