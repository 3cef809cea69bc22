"""The probe's verdicts (posenc.hf.probe.verdicts): their rules on synthetic curves, both ways,
and their numbers on the real SmolLM2-135M against a slow recomputation from its captured q/k.

The real-model test is skipped, with the reason, only when the model's package cannot be
installed (offline); see tests/test_real_models.py for the cache.
"""

from __future__ import annotations

import math

import pytest
import torch

from posenc.hf.probe import CLAIMS, LOW_SHARE, RISE_SHARE, judge, window_means

L = 800  # synthetic trained distance: windows of 100 tokens every 50
EXTEND = 4.0
D = torch.arange(int(EXTEND * L) + 1, dtype=torch.float64)


def _curves(full, raised, low_share=1.0):
    """The four curves judge reads; the low half carries ``low_share`` of ``full``."""
    return {"full": full, "low": low_share * full, "high": (1 - low_share) * full, "raised": raised}


def _fall_then_step(r):
    """Linear from 0 at d = 0 to -1 at d = L, then flat at -1 + r: a rise of r past L."""
    return torch.where(D < L, -D / L, -1.0 + r)


def _fall_on():
    """Linear from 0 down, without end: the decay goes on past L."""
    return -D / L


# window means of -d/L over [a, a + 100): -(a + 49.5)/L; start a = 0, trough a = 700
START, TROUGH = -49.5 / L, -749.5 / L
FALL = START - TROUGH  # 0.875


def test_window_means_are_the_mean_of_each_window():
    c = torch.randn(1000, dtype=torch.float64)
    starts, m = window_means(c, 100, 50)
    assert starts.tolist() == list(range(0, 901, 50))
    for a, v in zip(starts.tolist(), m.tolist()):
        assert v == pytest.approx(sum(c[a:a + 100].tolist()) / 100, abs=1e-12)


@pytest.mark.parametrize("r, holds", [(0.45, False), (0.55, True), (1.2, True), (0.0, False)])
def test_rise_verdict_both_ways(r, holds):
    """(a): the climb back past L against half the fall within L (window means, exact here)."""
    v = judge(_curves(_fall_then_step(r), _fall_on()), L, EXTEND, 16)["rise"]
    assert v["holds"] is holds
    assert v["start"] == pytest.approx(START) and v["trough"] == pytest.approx(TROUGH)
    assert v["trough_window"] == [700, 799] and v["fall"] == pytest.approx(FALL)
    assert v["rise"] == pytest.approx(-1 + r - TROUGH)
    assert v["rise_over_fall"] == pytest.approx((-1 + r - TROUGH) / FALL)
    assert (v["rise_over_fall"] >= RISE_SHARE) is holds


@pytest.mark.parametrize("raised, holds", [
    (_fall_on(), True),                        # keeps decaying past L
    (0.5 * _fall_on(), True),                  # decays slower: still no rise
    (_fall_then_step(0.55), False),            # climbs back past L as the model does
    (torch.zeros_like(D), False),              # flat: no decay to bring back
])
def test_raised_base_verdict_both_ways(raised, holds):
    """(b): the raised-base curve falls within L and does not climb back past it by (a)'s yardstick."""
    v = judge(_curves(_fall_then_step(1.0), raised), L, EXTEND, 16)["raised_base"]
    assert v["holds"] is holds and v["model_fall"] == pytest.approx(FALL) and v["base_factor"] == 16
    assert v["rise_over_model_fall"] == pytest.approx(v["rise"] / FALL)


def test_raised_base_reports_a_late_climb():
    """A raised curve that falls to 2L and climbs back to near 0 by 4L: it climbs above its
    trough within L by more than half the model's fall, so (b) does not hold; its lowest window
    past L and the climb from there to the farthest window are stored."""
    raised = torch.where(D < 2 * L, -D / L, -2.0 + (D - 2 * L) / L)  # a V with its bottom at 2L
    v = judge(_curves(_fall_then_step(1.0), raised), L, EXTEND, 16)["raised_base"]
    mean = {a: sum(raised[a:a + 100].tolist()) / 100 for a in range(0, 3102, 50)}
    low = min((a for a in mean if a >= L), key=mean.get)
    assert v["lowest_window"] == [low, low + 99] and v["lowest_beyond"] == pytest.approx(mean[low])
    assert v["late_climb"] == pytest.approx(mean[3100] - mean[low])  # the last window is the highest after it
    assert v["holds"] is False and v["rise"] == pytest.approx(mean[3100] - mean[700])


@pytest.mark.parametrize("share, holds", [(0.7, False), (0.8, True), (1.0, True), (-0.2, False)])
def test_low_half_verdict_both_ways(share, holds):
    """(c): the low half's share of the fall to the trough window against 3/4."""
    v = judge(_curves(_fall_then_step(1.0), _fall_on(), share), L, EXTEND, 16)["low_half"]
    assert v["holds"] is holds and v["low_share"] == pytest.approx(share)
    assert v["low_fall"] + v["high_fall"] == pytest.approx(v["fall"])
    assert (v["low_share"] >= LOW_SHARE) is holds


def test_no_fall_within_L_is_no_claim_holding():
    """A curve that rises from d = 0 has no decay: (a), (b) and (c) do not hold, their ratios NaN."""
    v = judge(_curves(D / L, _fall_on()), L, EXTEND, 16)
    assert not any(x["holds"] for x in v.values()) and set(v) == set(CLAIMS)
    assert math.isnan(v["rise"]["rise_over_fall"]) and math.isnan(v["low_half"]["low_share"])


def test_too_short_a_curve_is_refused():
    with pytest.raises(ValueError, match="windows inside and past the trained distance"):
        judge(_curves(D[: L + 10], D[: L + 10]), L, EXTEND, 16)


# --- the real SmolLM2-135M -------------------------------------------------------------------

NAME = "smollm2-135m"


@pytest.fixture(scope="module")
def smol():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    from posenc.hf.models import resolve_model

    try:
        path = resolve_model(NAME)
    except ValueError as e:
        if "install" in str(e) and "failed" in str(e):
            pytest.skip(f"{NAME} cannot be installed here (offline?): {e}")
        raise
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: 2 threads wait on each other
    try:
        yield path, transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    finally:
        torch.set_num_threads(before)


def _slow_head_mean_curve(q, k, inv_freq, scale, last, pairs):
    """scale * mean over heads of qbar_h . R(d) kbar_g(h) at d = 0..last, written out pair by
    pair (Llama's half layout: pair j is channels j and j + D/2), float64, transformers' inv_freq."""
    H, Hkv, Dh = q.shape[0], k.shape[0], q.shape[-1]
    qbar, kbar = q[:, 1:].double().mean(1), k[:, 1:].double().mean(1).repeat_interleave(H // Hkv, 0)
    d = torch.arange(last + 1, dtype=torch.float64)
    out = torch.zeros(last + 1, dtype=torch.float64)
    half = Dh // 2
    for j in pairs:
        q1, q2, k1, k2 = qbar[:, j], qbar[:, j + half], kbar[:, j], kbar[:, j + half]
        a, b = (q1 * k1 + q2 * k2).mean(), (q1 * k2 - q2 * k1).mean()
        out += a * torch.cos(d * float(inv_freq[j])) + b * torch.sin(d * float(inv_freq[j]))
    return scale * out


def test_probe_verdicts_on_smollm2_equal_a_slow_recomputation(smol, tmp_path):
    """`posenc probe` end to end on the real SmolLM2 (layer 0, 128 tokens, curves to 2L): its
    verdicts' window means equal an explicit loop over the formula on the captured q/k, with
    transformers' own inv_freq (base 100000 and 1600000), windows summed one by one."""
    from posenc.hf.probe import ProbeSettings, capture_qk, probe
    from posenc.hf.probe.capture import probe_text_ids
    from posenc.hf.checkpoint import load_tokenizer, open_checkpoint

    path, model = smol
    s = ProbeSettings(tokens=128, extend=2.0, points=256, scalings=(), dtype="float32")
    r = probe(path, tmp_path / "probe", s, progress=False, model=model)
    data = r.data
    assert data["settings"]["layers"] == [0] and data["trained_length"] == 8192
    entry = data["layers"]["0"]
    assert entry["rope"]["base"] == 100000.0 and entry["trained_distance"] == 8192
    assert {p.name for p in r.figures} == {"probe_layer0.png"} and (tmp_path / "probe" / "probe.json").is_file()

    ids = probe_text_ids(load_tokenizer(open_checkpoint(path)), None, 128)
    q, k = capture_qk(model, torch.tensor([ids]), [0])[0]
    scale = model.model.layers[0].self_attn.scaling
    inv = model.model.rotary_emb.inv_freq.double()
    cfg = model.config.to_dict()
    raised_cfg = transformers_config_with_base(cfg, 16 * 100000.0)
    inv_raised = _hf_inv_freq(raised_cfg)
    last = 2 * 8192
    pairs = range(32)  # theta_j decreasing: the high-frequency half is j < 16
    full = _slow_head_mean_curve(q, k, inv, scale, last, pairs)
    high = _slow_head_mean_curve(q, k, inv, scale, last, range(16))
    low = _slow_head_mean_curve(q, k, inv, scale, last, range(16, 32))
    raised = _slow_head_mean_curve(q, k, inv_raised, scale, last, pairs)
    w, step = 1024, 512

    def windows(c):
        return {a: float(c[a:a + w].sum()) / w for a in range(0, last + 2 - w, step)}

    M, Ml, Mh, Mb = windows(full), windows(low), windows(high), windows(raised)
    inside = [a for a in M if a + w <= 8192]
    beyond = [a for a in M if a >= 8192]
    t = min(inside, key=M.get)
    p = max(beyond, key=M.get)
    F = M[0] - M[t]
    v = entry["verdicts"]
    tol = dict(rel=1e-4, abs=1e-5)
    assert v["rise"]["start"] == pytest.approx(M[0], **tol) and v["rise"]["trough"] == pytest.approx(M[t], **tol)
    assert v["rise"]["trough_window"] == [t, t + w - 1] and v["rise"]["peak_window"] == [p, p + w - 1]
    assert v["rise"]["peak_beyond"] == pytest.approx(M[p], **tol)
    assert v["rise"]["holds"] is (M[p] - M[t] >= RISE_SHARE * F and F > 0)
    tb = min(inside, key=Mb.get)
    pb = max(beyond, key=Mb.get)
    assert v["raised_base"]["start"] == pytest.approx(Mb[0], **tol)
    assert v["raised_base"]["rise"] == pytest.approx(Mb[pb] - Mb[tb], **tol)
    assert v["raised_base"]["holds"] is (F > 0 and Mb[0] > Mb[tb] and Mb[pb] - Mb[tb] < RISE_SHARE * F)
    assert v["low_half"]["low_fall"] == pytest.approx(Ml[0] - Ml[t], **tol)
    assert v["low_half"]["high_fall"] == pytest.approx(Mh[0] - Mh[t], **tol)
    assert v["low_half"]["holds"] is (F > 0 and (Ml[0] - Ml[t]) / F >= LOW_SHARE)


def transformers_config_with_base(cfg: dict, base: float) -> dict:
    """A copy of a Llama config dict with its RoPE base replaced (transformers 5's rope_parameters)."""
    out = dict(cfg)
    out["rope_parameters"] = dict(cfg["rope_parameters"], rope_theta=base)
    return out


def _hf_inv_freq(cfg: dict) -> torch.Tensor:
    """transformers' own inv_freq for a Llama config dict."""
    import transformers

    conf = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    return transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(conf).inv_freq.double()
