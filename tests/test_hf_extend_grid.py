"""posenc.hf.extend_grid: the candidates per flag, the interval rule on hand-made rows, the
progress line; and ``posenc extend`` end to end on a tiny random Llama: a line per candidate
on stderr with a decreasing ETA, the dtype reaching the model, the refusals before loading."""

from __future__ import annotations

import json
import re

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5", reason="posenc.hf needs transformers>=5 (posenc[hf])")

from posenc.cli import main  # noqa: E402
from posenc.hf.extend_grid import NONE, candidates, choose, format_table, from_flag, progress_line  # noqa: E402
from posenc.intervals import wilson  # noqa: E402
from posenc.methods import METHODS  # noqa: E402
from posenc.rotary.scaling import SCALINGS, list_scalings  # noqa: E402

L, N = 64, 256
_SIZES = dict(vocab_size=260, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
              num_hidden_layers=2, max_position_embeddings=L, initializer_range=0.2, pad_token_id=0,
              bos_token_id=1, eos_token_id=2, rope_theta=1e4)


def test_the_default_grid_has_every_scaling_and_every_method_on_llama():
    grid = candidates(L, N, (1.0,), model_type="llama")
    assert grid[0].label == NONE and grid[0].scaling is None and grid[0].method is None
    assert {c.scaling for c in grid if c.scaling} == set(list_scalings(extends=True))
    methods = [c for c in grid if c.method]
    assert [c.method for c in methods] == list(METHODS)
    for c in methods:  # the paper's parameters, spelt in the label
        assert c.params == METHODS[c.method].recommended(L, N)
        assert c.label == METHODS[c.method].label + " " + " ".join(f"{k}={v:g}" for k, v in c.params.items())
    se = next(c for c in methods if c.method == "self_extend")
    assert se.params == dict(group_size=5, neighbor_window=16)  # W = L/4; G = ceil((256 - 16) / (64 - 16))


def test_flags_narrow_the_grid_and_none_stays():
    labels = lambda **kw: [c.label for c in candidates(L, N, (1.0, 2.0), model_type="llama", **kw)]  # noqa: E731
    assert labels(scalings=("yarn",), methods=()) == [NONE, f"{SCALINGS['yarn'].label} x4", f"{SCALINGS['yarn'].label} x8"]
    assert labels(scalings=(), methods=("rerope",)) == [NONE, "ReRoPE window=8 slope=0"]
    assert labels(scalings=(), methods=()) == [NONE]
    # a type without the methods' attention: none by default, refused when named
    other = candidates(L, N, (1.0,), model_type="gemma3_text")
    assert other and not any(c.method for c in other)
    with pytest.raises(ValueError, match=r"--methods self_extend: model_type 'gemma3_text' is not one whose attention"):
        candidates(L, N, (1.0,), methods=("self_extend",), model_type="gemma3_text")
    with pytest.raises(ValueError, match=r"--scalings: unknown name 'yarm'; valid: .*yarn"):
        candidates(L, N, (1.0,), scalings=("yarm",), model_type="llama")


def test_none_drops_a_family_and_only_alone():
    assert from_flag("--methods", None) is None
    assert from_flag("--methods", ["none"]) == ()
    assert from_flag("--scalings", ["yarn", "linear", "yarn"]) == ("yarn", "linear")
    with pytest.raises(ValueError, match=r"--scalings: none drops the whole family; give it alone, got none yarn"):
        from_flag("--scalings", ["none", "yarn"])


def row(label: str, right: int, trials: int, ppl: float) -> dict:
    low, high = wilson(right, trials)
    return dict(label=label, ppl=ppl, ppl_low=ppl * 0.9, ppl_high=ppl * 1.1, passkey=right / trials,
                passkey_right=right, passkey_trials=trials, passkey_low=low, passkey_high=high, seconds=1.0)


def test_a_candidate_significantly_worse_at_passkey_is_excluded():
    """3/3 against 2/3: Wilson's high end of 2/3 is 0.94 < 1, so the 2/3 row's lower perplexity
    does not win; the old rule (best minus one example) would have chosen it."""
    rows = [row("none", 3, 3, 20.0), row("A", 2, 3, 10.0), row("B", 3, 3, 15.0)]
    assert wilson(2, 3)[1] < 1.0
    win, rule = choose(rows)
    assert win == 2 and "Wilson" in rule


def test_a_candidate_within_the_interval_competes_on_perplexity():
    """Best 2/3 (0.67): 1/3's high end (0.79) reaches it, so 1/3 competes and its lower
    perplexity wins; 0/3 (high end 0.56) does not; a NaN perplexity never wins."""
    rows = [row("none", 2, 3, 20.0), row("A", 1, 3, 12.0), row("B", 0, 3, 5.0), row("C", 2, 3, float("nan"))]
    assert wilson(1, 3)[1] >= 2 / 3 > wilson(0, 3)[1]
    assert choose(rows)[0] == 1
    tie = [row("none", 3, 3, 10.0), row("A", 3, 3, 10.0)]
    assert choose(tie)[0] == 0  # ties: the earlier row
    with pytest.raises(ValueError, match="NaN perplexity"):
        choose([row("none", 1, 1, float("nan"))])


def test_table_and_progress_line_show_the_intervals():
    rows = [row("none", 3, 3, 20.0), row("YaRN x1.5", 2, 3, 12.3)]
    table = format_table(rows, 0, N)
    assert "[18.000, 22.000]" in table and "2/3" in table and "<- chosen" in table.splitlines()[1]
    line = progress_line(2, 9, rows[1], 41.2, 372.0)
    assert line == "[2/9] YaRN x1.5: ppl 12.3 [11.07, 13.53], passkey 2/3; 41 s; ETA 6.2 min"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("m") / "llama"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**_SIZES)).save_pretrained(folder)
    return folder


def test_a_line_per_candidate_with_a_decreasing_eta(tiny, tmp_path, capsys, monkeypatch):
    """Three candidates (none, YaRN, Self-Extend) and two depths: three lines on stderr, each
    with the row's numbers; the clock is made to advance 10 s per reading, so every candidate
    takes 10 s and the ETA is exactly 20 s, 10 s, 0 s."""
    import types

    import posenc.hf.extend_measure as library

    ticks = iter(range(0, 10**6, 10))
    monkeypatch.setattr(library, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    argv = ["extend", str(tiny), "--to", str(N), "--factors", "1", "--scalings", "yarn", "--methods", "self_extend",
            "--depths", "0", "1", "--json", str(tmp_path / "ev.json")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("[")]
    assert len(lines) == 3, err
    pattern = (r"\[(\d)/3\] (.+): ppl [\d.]+ \[[\d.]+, [\d.]+\], passkey ([0-2])/2; 10 s; ETA ([\d.]+) min")
    found = [re.fullmatch(pattern, ln) for ln in lines]
    assert all(found), lines
    assert [m.group(1) for m in found] == ["1", "2", "3"]
    assert [m.group(2) for m in found] == [NONE, f"{SCALINGS['yarn'].label} x4", "Self-Extend group_size=5 neighbor_window=16"]
    assert [float(m.group(4)) for m in found] == [0.3, 0.2, 0.0]  # 20 s, 10 s, 0 s
    ev = json.loads((tmp_path / "ev.json").read_text())
    assert ev["settings"]["depths"] == [0.0, 1.0] and ev["settings"]["methods"] == ["self_extend"]
    for r, m in zip(ev["candidates"], found):
        assert r["ppl_low"] <= r["ppl"] <= r["ppl_high"] and r["passkey_trials"] == 2
        assert r["passkey_right"] == int(m.group(3))
        assert (r["passkey_low"], r["passkey_high"]) == pytest.approx(wilson(r["passkey_right"], 2))
    assert ev["candidates"][2]["method"] == "self_extend" and ev["candidates"][2]["hf"] is None
    assert ev["written"] in (NONE, f"{SCALINGS['yarn'].label} x4")  # config.json cannot say a method


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_dtype_reaches_the_model(tiny, tmp_path, monkeypatch, dtype):
    import posenc.hf.checkpoint as checkpoint

    seen = []
    real = checkpoint.load_model

    def recording(*a, **k):
        model = real(*a, **k)
        seen.append({p.dtype for p in model.parameters()} | {next(model.parameters()).device.type})
        return model

    monkeypatch.setattr(checkpoint, "load_model", recording)
    argv = ["extend", str(tiny), "--to", str(N), "--scalings", "none", "--methods", "none", "--depths", "1",
            "--dtype", dtype, "--device", "cpu", "--no-progress", "--json", str(tmp_path / "ev.json")]
    assert main(argv) == 0
    assert seen == [{getattr(torch, dtype), "cpu"}]
    ev = json.loads((tmp_path / "ev.json").read_text())
    assert [r["label"] for r in ev["candidates"]] == [NONE] and ev["settings"]["dtype"] == dtype
    assert ev["candidates"][0]["ppl"] == ev["candidates"][0]["ppl"]  # not NaN in half precision


@pytest.mark.parametrize("argv, message", [
    (["--device", "cuda"], "argument --device: CUDA is not available on this machine"),
    (["--device", "mps"], "argument --device: must be cpu, cuda or cuda:N, got 'mps'"),
    (["--dtype", "float64"], "argument --dtype: invalid choice: 'float64'"),
    (["--depths", "1.5"], "argument --depths: must be a float in [0, 1]"),
    (["--scalings", "yarm"], "argument --scalings: must be none or one of"),
    (["--methods", "self-extend"], "argument --methods: must be none or one of self_extend"),
    (["--scalings", "none", "yarn"], "--scalings: none drops the whole family; give it alone, got none yarn"),
])
def test_refusals_are_one_line_before_loading(argv, message, capsys, monkeypatch):
    import posenc.hf.checkpoint as checkpoint

    if torch.cuda.is_available() and argv[:2] == ["--device", "cuda"]:
        pytest.skip("this machine has CUDA")
    monkeypatch.setattr(checkpoint, "load_model", lambda *a, **k: pytest.fail("loaded"))
    try:
        code = main(["extend", "/no/such/model", "--to", str(N), *argv])
    except SystemExit as e:  # argparse
        code = e.code
    assert code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln and not ln.startswith(("usage:", " "))]
    assert len(err) == 1 and message in err[0], err


def test_a_winning_method_is_reported_and_the_best_rope_candidate_written(tiny, tmp_path, capsys, monkeypatch):
    """config.json cannot say an attention method: when one wins by the rule, extend.json names it
    as the winner, the folder gets the best RoPE candidate by the same rule, and stderr says how
    to run the method."""
    import posenc.hf.extend as library

    def measured(lm, grid, written, settings, *a, **k):
        ppl = {None: 30.0, "yarn": 20.0, "linear": 25.0}
        return [dict(row(c.label, 3, 3, 10.0 if c.method else ppl.get(c.scaling, 40.0)), scaling=c.scaling,
                     method=c.method, params=c.params, hf=hf) for c, hf in zip(grid, written)]

    monkeypatch.setattr(library, "_measure", measured)
    out = tmp_path / "ext"
    assert main(["extend", str(tiny), "--to", str(N), "--factors", "1", "--scalings", "linear", "yarn",
                 "--methods", "rerope", "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    ev = json.loads((out / "extend.json").read_text())
    yarn = next(r for r in ev["candidates"] if r["scaling"] == "yarn")
    assert ev["winner"] == "ReRoPE window=8 slope=0" and ev["written"] == yarn["label"]
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"] == yarn["hf"]["rope_parameters"] and config["rope_parameters"]["rope_type"] == "yarn"
    assert "posenc.hf.patch_model(model, method='rerope', window=8, slope=0.0)" in captured.err
    assert "<- chosen" in captured.out and "<- written (best RoPE candidate)" in captured.out


def test_torchrun_two_ranks_give_one_process_rows(tiny, tmp_path):
    """``torchrun --nproc_per_node 2 -m posenc extend``: the units (each candidate's perplexity,
    each passkey prompt) split over two gloo ranks, gathered, give one process's rows exactly."""
    import os
    import subprocess
    import sys

    argv = ["extend", str(tiny), "--to", str(N), "--factors", "1", "--scalings", "yarn", "--methods", "self_extend",
            "--depths", "0", "0.5", "1", "--no-progress"]
    assert main([*argv, "--json", str(tmp_path / "one.json")]) == 0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "posenc",
           *argv, "--json", str(tmp_path / "two.json")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("candidates at N") == 1  # the estimate from rank 0 alone
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    drop = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert drop(two["candidates"]) == drop(one["candidates"]) and len(one["candidates"]) == 3
    assert two["winner"] == one["winner"]


def test_units_split_over_ranks_cover_the_grid_once():
    from posenc.hf.extend_measure import units

    all_units = units(3, 4)
    assert len(all_units) == 3 * 5 and all_units[:2] == [(0, None), (0, 0)]
    shares = [[u for k, u in enumerate(all_units) if k % 4 == r] for r in range(4)]
    assert sum(len(s) for s in shares) == len(all_units) and len({u for s in shares for u in s}) == len(all_units)
    assert all(len(s) in (3, 4) for s in shares)  # balanced to one unit


def test_the_small_method_grid_starts_at_the_recommended_set():
    small = candidates(L, N, (1.0,), scalings=(), model_type="llama", method_grid="small")
    rec = candidates(L, N, (1.0,), scalings=(), model_type="llama")
    for name, cls in METHODS.items():
        rows = [c for c in small if c.method == name]
        assert [c.params for c in rows] == [dict(p) for p in cls.grid(L, N)]
        assert rows[0].params == cls.recommended(L, N) == next(c.params for c in rec if c.method == name)
        assert len(rows) >= 3 and len({c.label for c in rows}) == len(rows)  # distinct, labelled by parameters
    with pytest.raises(ValueError, match=r"--method-grid must be one of 'recommended', 'small'"):
        candidates(L, N, (1.0,), model_type="llama", method_grid="large")
