"""``posenc check``: each check gives the textbook answer on known cases.

Known answers (the papers' claims): sinusoidal is relative in PE(p)·PE(q) and has a linear
map T(k) (Vaswani et al. 2017); a learned table is neither; RoPE is relative (RoFormer eq. 16),
bounded and usable with linear attention (§3.3); ALiBi is relative, unbounded and decays
linearly without end (Press et al. 2022). A RoPE whose frequency table is shuffled per
position must fail the relative check.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import posenc
from posenc.analysis import checks as C
from posenc.cli import main

from analysis_doubles import MiniALiBi, MiniLogBias, MiniRoPE, MiniTable, ShuffledRoPE, make

# A smaller probe keeps the file fast; the claims do not depend on the size.
PROBE = C.Probe(d_model=32, num_heads=2, train_len=32, far_len=512, max_probe_position=4096)
NO_COST = [k for k in C.CHECKS if k != "cost"]


def run(enc, only=NO_COST):
    return C.check_encoding(enc, PROBE, only=only)


def status(results):
    return {k: r.status for k, r in results.items()}


def registered(name):
    assert name in posenc.list_encodings(), f"encoding {name!r} is not registered"
    return C.build_probe_encoding(name, PROBE)


def test_sinusoidal_textbook():
    r = run(registered("sinusoidal"))
    assert status(r) == {
        "absolute": "yes", "relative": "yes", "linear_map": "yes", "bounded": "yes",
        "decay": "yes", "extrapolation": "yes", "linear_attention": "yes",
    }
    assert float(r["relative"].value) < 1e-6
    assert float(r["linear_map"].value) < 1e-6


def test_learned_textbook():
    r = run(registered("learned"))
    assert r["absolute"].status == "yes"
    assert r["relative"].status == "no"
    assert r["linear_map"].status == "no"
    assert r["extrapolation"].status == "no"
    assert r["extrapolation"].data["max_position"] == 1023  # default table of 1024 rows


def test_none_has_no_position_signal():
    r = run(registered("none"))
    assert r["absolute"].status == "no"
    assert r["relative"].status == "n/a" and "position" in r["relative"].detail
    assert r["linear_map"].status == "n/a"
    assert r["decay"].status == "n/a"


def test_rope_double_textbook():
    r = run(make(MiniRoPE, 32, 2))
    s = status(r)
    assert s["absolute"] == "yes"
    assert s["relative"] == "yes" and float(r["relative"].value) < 1e-5
    assert s["linear_map"] == "yes"
    assert s["bounded"] == "yes"
    assert s["decay"] == "yes"
    assert s["extrapolation"] == "yes"
    assert s["linear_attention"] == "yes"


def test_shuffled_rope_fails_relative():
    r = run(make(ShuffledRoPE, 32, 2), only=["relative", "linear_map"])
    assert r["relative"].status == "no"
    assert float(r["relative"].value) > 1e-2
    assert r["linear_map"].status == "no"


def test_alibi_double_textbook():
    r = run(make(MiniALiBi, 32, 2))
    s = status(r)
    assert s["absolute"] == "no" and "shift-invariant" in r["absolute"].detail
    assert s["relative"] == "yes"
    assert s["linear_map"] == "n/a"
    assert s["bounded"] == "no"  # the bias grows linearly with distance
    # max |bias| at far_len / at train_len - 1 is about far_len / train_len
    assert float(r["bounded"].value.lstrip("x")) > 0.5 * PROBE.far_len / PROBE.train_len
    assert s["decay"] == "yes" and "still" in r["decay"].value
    assert r["extrapolation"].data["shape"] == "keeps decaying"
    assert s["linear_attention"] == "no"


def test_table_double_rejects_positions():
    assert C.max_position(make(MiniTable, 32, 2, max_len=40), PROBE) == 39
    r = run(make(MiniTable, 32, 2, max_len=40), only=["extrapolation"])
    assert r["extrapolation"].status == "no"


def test_logits_match_explicit_rope_formula():
    # RoFormer eq. 16 written out pair by pair: pair p of q at i rotated by i * theta_p.
    enc = make(MiniRoPE, 32, 2)
    pos = torch.arange(5)
    s = C.position_logits(enc, pos, pos, PROBE)
    qc, kc = C._content(enc, PROBE)
    D = 16
    want = torch.zeros(2, 5, 5, dtype=torch.float64)
    for h in range(2):
        for i in range(5):
            for j in range(5):
                tot = 0.0
                for p in range(D // 2):
                    th = 10000.0 ** (-2 * p / D) * (i - j)
                    a, b = qc[h, 2 * p].item(), qc[h, 2 * p + 1].item()
                    c, d = kc[h, 2 * p].item(), kc[h, 2 * p + 1].item()
                    # expanding (R_i q)·(R_j k) with A = i theta, B = j theta:
                    # (a c + b d) cos(A - B) + (a d - b c) sin(A - B)
                    tot += (a * c + b * d) * math.cos(th) + (a * d - b * c) * math.sin(th)
                want[h, i, j] = tot / D**0.5
    torch.testing.assert_close(s, want, atol=1e-5, rtol=1e-5)


def test_decay_profile_on_a_known_curve():
    # s(d) = -d: the envelope falls in every octave, so it never stops before the end.
    s = -torch.arange(65, dtype=torch.float64)
    prof = C._decay_profile(s)
    assert prof["edges"] == [1, 2, 4, 8, 16, 32, 64]
    assert prof["drop"] == pytest.approx((-1 - (-64)) / 63)
    assert prof["stop_bin"] == len(prof["upper"]) - 1
    # s(d) = -min(d, 8): flat from 8 on, so it stops in the octave that starts at 8.
    prof = C._decay_profile(-torch.arange(65, dtype=torch.float64).clamp(max=8))
    assert prof["edges"][prof["stop_bin"]] == 8


def test_cost_counts_parameters():
    r = C.check_encoding(make(MiniTable, 32, 2, max_len=40), PROBE, only=["cost"])["cost"]
    assert r.data["params"] == 40 * 32
    assert r.data["time_ratio"] > 0


def test_every_registered_encoding_runs_without_probe_errors():
    tiny = C.Probe(d_model=16, num_heads=2, train_len=16, far_len=64, max_probe_position=256)
    for name in posenc.list_encodings():
        r = C.check_encoding(C.build_probe_encoding(name, tiny), tiny, only=NO_COST)
        errors = {k: v.detail for k, v in r.items() if v.status == "error"}
        assert not errors, f"{name}: {errors}"


def test_probe_rejects_bad_sizes():
    with pytest.raises(ValueError, match="divisible"):
        C.Probe(d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="far_len"):
        C.Probe(train_len=128, far_len=100)


def test_cli_json_and_table(capsys):
    assert main(["check", "none", "--json", "--d-model", "32", "--heads", "2", "--train-len", "32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["none"]) == set(C.CHECKS)
    assert out["none"]["relative"]["status"] == "n/a"
    assert main(["check", "sinusoidal", "--d-model", "32", "--heads", "2", "--train-len", "32"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split()[0] == "encoding"
    assert "sinusoidal" in text and "Vaswani" in text


def test_cli_unknown_encoding_lists_valid_ones(capsys):
    assert main(["check", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown encoding 'nope'" in err and "sinusoidal" in err


def test_registered_rope_and_alibi_textbook():
    rope = run(registered("rope"), only=["relative", "linear_map", "bounded", "linear_attention"])
    assert status(rope) == {"relative": "yes", "linear_map": "yes", "bounded": "yes", "linear_attention": "yes"}
    alibi = run(registered("alibi"), only=["relative", "bounded", "linear_attention"])
    assert status(alibi) == {"relative": "yes", "bounded": "no", "linear_attention": "no"}


def test_small_log_bias_is_unbounded():
    # -0.01 log(1 + d) changes max |logit| by a few percent up to 512: the ratio alone would
    # call it bounded; the steady step per octave does not.
    r = run(make(MiniLogBias, 32, 2, r=0.01), only=["bounded"])["bounded"]
    assert r.status == "no", r
    assert "steady step" in r.detail
    steps = [b - a for a, b in zip(r.data["octave_max"], r.data["octave_max"][1:])]
    assert len(steps) >= 3 and all(s == pytest.approx(0.01 * math.log(2), rel=0.2) for s in steps[-3:])
    assert run(make(MiniRoPE, 32, 2), only=["bounded"])["bounded"].status == "yes"


def test_every_registered_encoding_has_literature_claims():
    from posenc.analysis.claims import EXPECTED

    assert set(EXPECTED) == set(posenc.list_encodings())


def test_verdicts_compare_measurement_with_claim():
    # ALiBi has no absolute position by design: "no", and that agrees with Press et al. 2022.
    r = run(registered("alibi"), only=["absolute", "bounded"])
    assert (r["absolute"].status, r["absolute"].verdict, r["absolute"].expected) == ("no", "agrees", "no")
    assert r["bounded"].verdict == "agrees" and "Press" in r["bounded"].source
    learned = run(registered("learned"), only=["decay", "extrapolation"])
    assert learned["decay"].verdict == "untrained"
    assert learned["extrapolation"].verdict == "agrees"
    # An unregistered double has no claims: every measured cell says so.
    mini = run(make(MiniRoPE, 32, 2), only=["relative"])["relative"]
    assert (mini.status, mini.verdict) == ("yes", "no claim")


def test_verdict_function():
    from posenc.analysis.claims import UNTRAINED, verdict

    assert verdict("yes", True) == "agrees" and verdict("no", True) == "differs"
    assert verdict("no", False) == "agrees" and verdict("yes", False) == "differs"
    assert verdict("yes", UNTRAINED) == "untrained" and verdict("no", None) == "no claim"
    assert verdict("n/a", True) == "n/a" and verdict("error", False) == "error"


def test_llama_sized_rope_check_finishes():
    # d_model 4096, 32 heads (head dim 128): the linear-map fit is done on the first heads'
    # codes, so the whole check takes seconds, not the hours a 8192-feature fit would.
    probe = C.Probe(d_model=4096, num_heads=32)
    r = C.check_encoding(C.build_probe_encoding("rope", probe), probe, only=NO_COST)
    assert {k: v.verdict for k, v in r.items()} == {k: "agrees" for k in NO_COST}
