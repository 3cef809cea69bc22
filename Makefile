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
# benchmark (3 seeds, within 12 minutes on a quiet 2-core CPU: docs/bench.md "make demo";
# an interrupted run resumes where it stopped), and one self-contained HTML report.
# The benchmark trains in two processes of one thread each (the models are too small for a
# second thread to help much), half the encodings each (about equal CPU time). Both write
# their runs into $(OUT)/bench/runs (the background one's runs/ is a link to it); the last
# bench call trains nothing unless an encoding was left out of both halves: it verifies and
# collects every run into $(OUT)/bench.
BENCH = $(VENV)/bin/posenc bench --preset quick --threads $(THREADS) --resume
DEMO_BACKGROUND = rope alibi t5
DEMO_FOREGROUND = none learned sinusoidal
demo: install
	$(VENV)/bin/posenc list --short
	$(VENV)/bin/posenc check
	mkdir -p $(OUT)/bench/runs $(OUT)/bench_bg
	ln -sfn ../bench/runs $(OUT)/bench_bg/runs
	@echo "posenc bench: $(DEMO_BACKGROUND) in the background (log: $(OUT)/bench_bg.log), $(DEMO_FOREGROUND) here"
	@$(BENCH) --encodings $(DEMO_BACKGROUND) --no-progress --out $(OUT)/bench_bg > $(OUT)/bench_bg.log 2>&1 & pid=$$!; \
	trap 'kill -TERM $$pid 2>/dev/null' INT TERM; \
	$(BENCH) --encodings $(DEMO_FOREGROUND) --out $(OUT)/bench > $(OUT)/bench_fg.log; a=$$?; \
	wait $$pid; b=$$?; \
	if [ $$b -ne 0 ]; then tail -n 5 $(OUT)/bench_bg.log; fi; \
	[ $$a -eq 0 ] && [ $$b -eq 0 ]
	$(VENV)/bin/posenc bench --preset quick --threads $(THREADS) --out $(OUT)/bench --resume
	$(VENV)/bin/posenc report --out $(OUT)/report --bench $(OUT)/bench
	@echo "report: $(OUT)/report/report.html"

# Re-run every measurement behind a number in README.md and docs/ (about half an hour on a
# 2-core CPU), then re-render their tables from the results files in benchmarks/results/.
results: install-test
	$(PY) benchmarks/tables.py --rerun

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
