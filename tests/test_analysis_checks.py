"""``posenc check``: each check gives the textbook answer on known cases.

Known answers (the papers' claims): sinusoidal is relative in PE(p)·PE(q) and has a linear
map T(k) (Vaswani et al. 2017); a learned table is neither; RoPE is relative (RoFormer eq. 16),
bounded and usable with linear attention (§3.3); ALiBi is relative, unbounded and decays
linearly without end (Press et al. 2022). A RoPE whose frequency table is shuffled per
position must fail the relative check.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc.analysis import checks as C
from posenc.analysis import probes as P
from posenc.analysis import runner as R
from posenc import SequenceInfo
from posenc.encoding import QKProjection

from analysis_doubles import MiniALiBi, MiniLogBias, MiniRoPE, MiniTable, ShuffledRoPE, make

# A smaller probe keeps the file fast; the claims do not depend on the size.
PROBE = P.Probe(d_model=32, num_heads=2, train_len=32, far_len=512, max_probe_position=4096)
NO_COST = [k for k in C.CHECKS if k != "cost"]


def run(enc, only=NO_COST):
    return R.check_encoding(enc, PROBE, only=only)


def status(results):
    return {k: r.status for k, r in results.items()}


def registered(name):
    assert name in posenc.list_encodings(), f"encoding {name!r} is not registered"
    return R.build_probe_encoding(name, PROBE)


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
    assert P.max_position(make(MiniTable, 32, 2, max_len=40), PROBE) == 39
    r = run(make(MiniTable, 32, 2, max_len=40), only=["extrapolation"])
    assert r["extrapolation"].status == "no"


def test_logits_match_explicit_rope_formula():
    # RoFormer eq. 16 written out pair by pair: pair p of q at i rotated by i * theta_p.
    enc = make(MiniRoPE, 32, 2)
    pos = torch.arange(5)
    s = P.position_logits(enc, pos, pos, PROBE)
    qc, kc = P.content_vectors(enc, PROBE)
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
    prof = P.decay_profile(s)
    assert prof["edges"] == [1, 2, 4, 8, 16, 32, 64]
    assert prof["drop"] == pytest.approx((-1 - (-64)) / 63)
    assert prof["stop_bin"] == len(prof["upper"]) - 1
    # s(d) = -min(d, 8): flat from 8 on, so it stops in the octave that starts at 8.
    prof = P.decay_profile(-torch.arange(65, dtype=torch.float64).clamp(max=8))
    assert prof["edges"][prof["stop_bin"]] == 8


def test_cost_counts_parameters():
    r = R.check_encoding(make(MiniTable, 32, 2, max_len=40), PROBE, only=["cost"])["cost"]
    assert r.data["params"] == 40 * 32
    assert r.data["time_ratio"] > 0


def test_every_registered_encoding_runs_without_probe_errors():
    tiny = P.Probe(d_model=16, num_heads=2, train_len=16, far_len=64, max_probe_position=256)
    for name in posenc.list_encodings():
        r = R.check_encoding(R.build_probe_encoding(name, tiny), tiny, only=NO_COST)
        errors = {k: v.detail for k, v in r.items() if v.status == "error"}
        assert not errors, f"{name}: {errors}"


def test_probe_rejects_bad_sizes():
    with pytest.raises(ValueError, match="divisible"):
        P.Probe(d_model=30, num_heads=4)
    with pytest.raises(ValueError, match="far_len"):
        P.Probe(train_len=128, far_len=100)


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


def test_every_encoding_of_posenc_declares_literature_claims():
    """Every encoding posenc registers declares its claims at registration, on known checks (an
    encoding registered from outside the package may declare none: "no claim")."""
    own = [n for n in posenc.list_encodings() if posenc.get_info(n).cls.__module__.startswith("posenc.")]
    assert len(own) >= 19
    for n in own:
        claims = posenc.get_info(n).claims
        assert claims, f"{n} declares no claims"
        assert set(claims) <= set(C.CHECKS) - {"cost"}, n


def test_a_claim_on_an_unknown_check_is_refused():
    from posenc.analysis.claims import expected_for
    from posenc.registry import register, unregister

    @register("claims_typo", family="relative", summary="a double", paper="none", claims={"relativ": (True, "x")})
    class Typo(MiniRoPE):
        pass

    try:
        with pytest.raises(ValueError, match="encoding 'claims_typo' claims 'relativ', not checks of posenc check"):
            expected_for("claims_typo", "relative")
    finally:
        unregister("claims_typo")
    with pytest.raises(ValueError, match="claim 'bounded' of encoding 'x': expected must be True, False or 'untrained'"):
        register("x", family="relative", summary="", paper="", claims={"bounded": ("yes", "a paper")})
    with pytest.raises(ValueError, match="claim 'bounded' of encoding 'x' needs its source"):
        register("x", family="relative", summary="", paper="", claims={"bounded": (True, "")})


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
    from posenc.analysis.claims import verdict
    from posenc.literature import UNTRAINED

    assert verdict("yes", True) == "agrees" and verdict("no", True) == "differs"
    assert verdict("no", False) == "agrees" and verdict("yes", False) == "differs"
    assert verdict("yes", UNTRAINED) == "untrained" and verdict("no", None) == "no claim"
    assert verdict("n/a", True) == "n/a" and verdict("error", False) == "error"


def test_llama_sized_rope_check_finishes():
    # d_model 4096, 32 heads (head dim 128): the linear-map fit is done on the first heads'
    # codes, so the whole check takes seconds, not the hours a 8192-feature fit would.
    probe = P.Probe(d_model=4096, num_heads=32)
    r = R.check_encoding(R.build_probe_encoding("rope", probe), probe, only=NO_COST)
    assert {k: v.verdict for k, v in r.items()} == {k: "agrees" for k in NO_COST}


TINY = P.Probe(d_model=16, num_heads=2, train_len=16, far_len=64, max_probe_position=256)


@pytest.mark.parametrize("case", ["self", "cross"])
@pytest.mark.parametrize("name", posenc.list_encodings())
def test_probe_logits_are_the_attention_layers(name, case):
    """The probe's logits are those of ``posenc.Attention(impl="eager")``: a layer whose query
    and key projections give the probe's content at every position and whose values differ
    per key outputs the probe's weights·v (+ value terms): softmax(probe logits), or their exp
    where the layer's terms are log weights (stick-breaking), forward at offset positions."""
    enc = R.build_probe_encoding(name, TINY)
    C, H, D = TINY.d_model, TINY.num_heads, TINY.d_model // TINY.num_heads
    tq, tk = (6, 6) if case == "self" else (3, 5)
    q_pos, k_pos = torch.arange(tq)[None] + 7, torch.arange(tk)[None] + (7 if case == "self" else 2)
    qc, kc = P.content_vectors(enc, TINY)
    g = torch.Generator().manual_seed(0)
    attn = posenc.Attention(C, H, pe=enc, impl="eager", causal=False)
    with torch.no_grad():
        for lin, col0 in ((attn.q_proj, qc.reshape(-1)), (attn.k_proj, kc.reshape(-1))):
            lin.weight.zero_()
            lin.weight[:, 0] = col0  # reads only feature 0, which every token has as 1
        attn.v_proj.weight.copy_(torch.randn(C, C, generator=g))
        attn.v_proj.weight[:, 0] = 0  # values from the other features, which differ per token
        attn.o_proj.weight.copy_(torch.eye(C))

    def tokens(t):  # (1, t, C): feature 0 is 1, the rest random
        x = torch.randn(1, t, C, generator=g)
        x[..., 0] = 1.0
        return x

    x, ctx_x = tokens(tq), tokens(tk)
    q = qc[None, :, None].expand(1, H, tq, D)
    k = kc[None, :, None].expand(1, H, tk, D)
    proj = QKProjection.of(attn, x if case == "self" else ctx_x)  # the layer input of the new keys (FoX's gates)
    logits = P.attention_logits(enc, q, k, q_pos, k_pos, proj)  # (1, H, Tq, Tk) float64
    with torch.no_grad():
        if case == "self":
            got = attn(x, SequenceInfo(q_pos))
            v = attn.v_proj(x)
        else:
            ctx = posenc.AttentionContext.build(SequenceInfo(q_pos), SequenceInfo(k_pos), causal=False)
            got = attn(x, ctx, context=ctx_x)
            v = attn.v_proj(ctx_x)
        v = v.view(1, tk, H, D).transpose(1, 2)  # (1, H, Tk, D)
        probs = P.attention_weights(enc, q, k, q_pos, k_pos, proj)  # softmax, or exp of log weights
        want = probs @ v.double()
        if enc.has_value_terms:
            want = want + enc.output(probs.float(), v, q_pos, k_pos).double()
    assert logits.shape == (1, H, tq, tk) and logits.isfinite().all()
    torch.testing.assert_close(got.double(), want.transpose(1, 2).reshape(1, tq, C), atol=1e-5, rtol=1e-5)
    # position_logits is the same attention part (plus the embed codes' product); an encoding that
    # reads the stream (FoX's gates, CoPE's counts, stick-breaking's sticks, across the cross case's
    # queries and keys) sees the probe's own identical tokens there, not this test's
    if not (enc.reads_layer_input or (case == "cross" and P.reads_the_stream(enc, TINY))):
        s = P.position_logits(enc, q_pos[0], k_pos[0], TINY)
        if not enc.has_embed:
            torch.testing.assert_close(s, logits[0].expand(H, tq, tk), atol=1e-6, rtol=1e-6)  # float32 rotations


def _committed_check_results():
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/results/check_cpu.json").read_text())
    return {n: {k: C.CheckResult(**r) for k, r in rs.items()} for n, rs in data["results"].items()}


def test_the_check_table_fits_a_terminal_and_keeps_every_cell():
    """``posenc check``'s table, on the committed results of every encoding: in one block its
    lines are over 200 characters (the real failure); split into blocks of columns, no line is
    over C.WIDTH, every block lists every encoding in order, and every column and cell appears
    exactly once, in the checks' order."""
    results = _committed_check_results()
    assert len(results) >= 19
    assert max(map(len, C.format_table(results, width=10**6).splitlines())) > 200
    text = C.format_table(results)
    assert max(map(len, text.splitlines())) <= C.WIDTH == 120
    blocks = [b.splitlines() for b in text.split("\n\n")]
    assert len(blocks) >= 2
    titles = [t for t, _ in C.CHECKS.values()]
    seen_titles, seen_cells = [], {n: [] for n in results}
    for b in blocks:
        header, rule, rows = b[0], b[1], b[2:]
        cuts = [i for i in range(len(rule)) if rule[i] == "-" and (i == 0 or rule[i - 1] == " ")] + [10**6]
        cols = lambda line: [line[a:c].strip() for a, c in zip(cuts, cuts[1:])]  # noqa: E731
        assert cols(header)[0] == "encoding"
        seen_titles += cols(header)[1:]
        assert [cols(r)[0] for r in rows] == list(results)
        for r in rows:
            seen_cells[cols(r)[0]] += cols(r)[1:]
    assert seen_titles == titles
    for n, rs in results.items():
        assert seen_cells[n] == [rs[k].cell() if k in rs else "" for k in C.CHECKS]


def test_the_claims_and_differing_cells_are_wrapped_to_the_width():
    text = C.format_claims()
    assert max(map(len, text.splitlines())) <= C.WIDTH
    one_line = " ".join(text.split())
    for _, title, claim, papers, measured in C.claims():  # wrapping loses no word
        assert f"{title}: {claim}" in one_line and papers in one_line and f"measured: {measured}" in one_line
    assert max(len(f"    measured: {m}") for *_, m in C.claims()) > C.WIDTH  # unwrapped, the old 674-char lines
    results = _committed_check_results()
    differ = C.format_differ(results)
    n = sum(r.verdict == "differs" for rs in results.values() for r in rs.values())
    assert len(differ) == n > 0 and all(max(map(len, d.splitlines())) <= C.WIDTH for d in differ)


def test_posenc_check_prints_no_line_over_the_width_and_json_is_unchanged(capsys):
    import json

    from posenc.cli import main

    args = ["check", "none", "alibi", "--d-model", "32", "--heads", "2", "--train-len", "32"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= C.WIDTH and "alibi" in out and "measured:" in out
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["none", "alibi"] and set(data["alibi"]) == set(C.CHECKS)
    assert set(data["alibi"]["relative"]) == {"status", "value", "detail", "data", "expected", "source", "verdict"}
