"""``posenc probe``: real q and k of a saved tiny Llama, re-rotated at every distance.

References are independent of posenc's RoPE: the frequencies come from transformers' own
rotary module for the same config (plain, raised base, linear, YaRN), the rotation is an
explicit (D, D) block matrix, and the mean over token pairs is taken over every pair (not
through the means of q and k the probe uses).
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.cli import main  # noqa: E402
from posenc.hf.checkpoint import check_fits, estimate_bytes, open_checkpoint  # noqa: E402
from posenc.hf.probe import (  # noqa: E402
    ProbeSettings, capture_qk, frequency_halves, layer_rope, probe, score_curves, variant_ropes,
)
from posenc.rotary import from_hf  # noqa: E402

L = 64  # the tiny model's trained length


def _config(**kw):
    return transformers.LlamaConfig(
        vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=L, rope_theta=10000.0, **kw)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config())
    # random init gives q/k means near 0; a bias-like shift makes the curves non-trivial
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.add_(torch.randn_like(layer.self_attn.q_proj.weight) * 0.2)
            layer.self_attn.k_proj.weight.add_(torch.randn_like(layer.self_attn.k_proj.weight) * 0.2)
    d = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(d)
    (d / "text.txt").write_text("def f(x):\n    return x * 2  # a line of Python\n" * 4)
    return d


@pytest.fixture(scope="module")
def model(ckpt):
    return transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32,
                                                             attn_implementation="eager").eval()


def _ids(n=40):
    return torch.tensor([list(b"def f(x):\n    return x * 2  # a line of Python\n" * 2)[:n]])


def _rotation(inv_freq: torch.Tensor, d: int, head_dim: int, af: float = 1.0) -> torch.Tensor:
    """(D, D) matrix rotating pair j (channels j, j + D/2: HF rotate_half) by d * theta_j, times af."""
    R = torch.eye(head_dim, dtype=torch.float64)
    h = head_dim // 2
    for j, theta in enumerate(inv_freq.double().tolist()):
        c, s = math.cos(d * theta), math.sin(d * theta)
        R[j, j], R[j, j + h], R[j + h, j], R[j + h, j + h] = c, -s, s, c
    return R * af


def _slow_curve(q, k, inv_freq, distances, scale, pairs=None, af=1.0):
    """scale * mean over every (query token i, key token j) of (R(d) q_i) . (af k_j), per head,
    tokens 1..T-1; optionally only the channels of ``pairs``."""
    H, Hkv, D = q.shape[0], k.shape[0], q.shape[-1]
    mask = torch.ones(D, dtype=torch.float64)
    if pairs is not None:
        mask = torch.zeros(D, dtype=torch.float64)
        mask[pairs] = 1
        mask[pairs + D // 2] = 1
    out = torch.zeros(H, len(distances), dtype=torch.float64)
    for h in range(H):
        Q, K = q[h, 1:].double(), k[h // (H // Hkv), 1:].double() * af
        for n, d in enumerate(distances):
            Qr = Q @ _rotation(inv_freq, int(d), D, af).T  # (T-1, D)
            out[h, n] = scale * ((Qr * mask) @ K.T).mean()
    return out


def test_capture_reproduces_the_models_attention(model):
    """Captured pre-rotation q/k, rotated by from_hf's RoPE at 0..T-1, give the model's own
    attention probabilities (eager attention, output_attentions) in both layers."""
    ids = _ids(24)
    got = capture_qk(model, ids, [0, 1])
    ref = model(input_ids=ids, output_attentions=True).attentions
    rope = from_hf(model.config)
    pos = torch.arange(ids.shape[1])[None]
    for layer in (0, 1):
        q, k = got[layer]
        assert q.shape == (4, 24, 8) and k.shape == (2, 24, 8)
        qr, kr = rope.rotate(q[None], k[None], pos, pos)
        kr = kr.repeat_interleave(2, dim=1)
        logits = qr @ kr.transpose(-1, -2) * 8**-0.5
        logits = logits.masked_fill(torch.ones(24, 24, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(logits.softmax(-1), ref[layer], atol=1e-5, rtol=1e-5)


_SMALL = dict(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=64)
FAMILIES = {
    "mistral": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=None)),
    "qwen2": ("Qwen2Config", dict(num_key_value_heads=2)),
    "qwen3": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=8)),  # q_norm / k_norm before RoPE
    "gemma": ("GemmaConfig", dict(num_key_value_heads=1, head_dim=8)),
    # q_norm / k_norm on (1, heads, T, D); per-layer-type RoPE (sliding base 10000, global 1e6)
    "gemma3_text": ("Gemma3TextConfig", dict(
        num_key_value_heads=1, head_dim=8, sliding_window=32, layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1e6}})),
    "phi3": ("Phi3Config", dict(num_key_value_heads=2, pad_token_id=0)),  # fused qkv_proj
    "gpt_neox": ("GPTNeoXConfig", dict(rotary_pct=0.5)),  # per-head [q | k | v], partial rotary
    "gptj": ("GPTJConfig", dict(n_embd=32, n_head=4, n_layer=2, n_positions=64, rotary_dim=4)),  # interleaved
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_capture_in_every_family(family):
    """Each family's taps, rotated by from_hf's RoPE and scaled by the tap's scale, give the
    model's own attention probabilities (eager attention)."""
    from posenc.hf.probe import layer_taps

    cls, extra = FAMILIES[family]
    kw = dict(_SMALL) if family != "gptj" else dict(vocab_size=260)
    cfg = getattr(transformers, cls)(**(kw | extra))
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ids = _ids(16)
    got = capture_qk(m, ids, [0, 1])
    with torch.no_grad():
        ref = m(input_ids=ids, output_attentions=True).attentions
    pos = torch.arange(16)[None]
    taps = layer_taps(m)
    for layer in (0, 1):
        q, k = got[layer]
        rope = layer_rope(m.config.to_dict(), layer)  # Gemma 3: the layer type's own base
        qr, kr = rope.rotate(q[None], k[None], pos, pos)
        kr = kr.repeat_interleave(q.shape[0] // k.shape[0], dim=1)
        logits = qr @ kr.transpose(-1, -2) * taps[layer].scale
        logits = logits.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(logits.softmax(-1), ref[layer].float(), atol=1e-5, rtol=1e-4)


def test_score_curve_equals_the_slow_explicit_loop(model):
    """full, high and low curves against the explicit-matrix reference with transformers'
    inv_freq; high + low + unrotated = full."""
    q, k = capture_qk(model, _ids(), [0])[0]
    rope = from_hf(model.config)
    distances = torch.tensor([0, 1, 5, 31, 63, 64, 100, 255])
    c = score_curves(q, k, rope, distances, 8**-0.5)
    inv_freq = model.model.rotary_emb.inv_freq
    torch.testing.assert_close(c["full"].double(), _slow_curve(q, k, inv_freq, distances, 8**-0.5), atol=1e-6, rtol=1e-5)
    high, low = frequency_halves(rope)
    assert high.tolist() == [0, 1] and low.tolist() == [2, 3]  # theta_j decreases with j
    torch.testing.assert_close(c["high"].double(), _slow_curve(q, k, inv_freq, distances, 8**-0.5, high), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(c["low"].double(), _slow_curve(q, k, inv_freq, distances, 8**-0.5, low), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(c["high"] + c["low"] + c["unrotated"], c["full"], atol=1e-6, rtol=1e-5)
    assert c["unrotated"].abs().max() == 0  # Llama rotates every channel
    assert c["full"].abs().max() > 1e-3  # not a curve of zeros


@pytest.mark.parametrize("name,hf_rope", [
    ("base x16", {"rope_type": "default", "rope_theta": 160000.0}),
    ("linear", {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}),
    ("yarn", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L, "rope_theta": 10000.0}),
    ("llama3", {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": L, "rope_theta": 10000.0}),
])
def test_variant_curves_use_transformers_frequencies(model, name, hf_rope):
    """Each variant's curve equals the slow reference with the inv_freq and attention factor
    transformers itself computes for that rope dict."""
    q, k = capture_qk(model, _ids(), [0])[0]
    ropes = variant_ropes(from_hf(model.config), L, 4.0, 16.0, ("linear", "yarn", "llama3"))
    distances = torch.tensor([0, 3, 63, 64, 200, 256])
    c = score_curves(q, k, ropes[name], distances, 8**-0.5, frequency_halves(ropes["model"]))
    hf = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(_config(rope_parameters=hf_rope))
    ref = _slow_curve(q, k, hf.inv_freq, distances, 8**-0.5, af=hf.attention_scaling)
    torch.testing.assert_close(c["full"].double(), ref, atol=1e-6, rtol=1e-5)


def test_probe_cli_end_to_end(ckpt, model, tmp_path):
    """`posenc probe` writes probe.json whose curves are the slow reference's (mean over heads),
    the verdicts per layer, one PNG per layer and the layers side by side."""
    out = tmp_path / "probe"
    code = main([
        "probe", str(ckpt), "--out", str(out), "--layer", "0", "1", "--text", str(ckpt / "text.txt"),
        "--tokens", "40", "--dtype", "float32", "--points", "50", "--scalings", "linear", "--extend", "4", "--no-progress",
    ])
    assert code == 0
    data = json.loads((out / "probe.json").read_text())
    assert (out / "probe_layer0.png").stat().st_size > 10_000 and (out / "probe_layer1.png").is_file()
    assert (out / "probe_layers.png").stat().st_size > 10_000  # two layers: side by side too
    assert set(data["layers"]["0"]["verdicts"]) == {"rise", "raised_base", "low_half"}
    assert data["trained_length"] == L and data["tokenizer"] == "bytes" and data["text_tokens"] == 40
    d = torch.tensor(data["distances"])
    assert d[0] == 0 and d[-1] == 4 * L and len(d) == 50  # 257 distances > 50 points: evenly spaced
    assert set(data["layers"]["0"]["curves"]) == {"model", "base x16", "linear"}
    ids = _ids(40)
    for layer in (0, 1):
        q, k = capture_qk(model, ids, [layer])[layer]
        ref = _slow_curve(q, k, model.model.rotary_emb.inv_freq, d.tolist(), 8**-0.5).mean(0)
        got = torch.tensor(data["layers"][str(layer)]["curves"]["model"]["full"], dtype=torch.float64)
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)


def test_probe_heads_are_averaged(ckpt, model, tmp_path):
    """--heads 1 3: the curve is the mean of those heads' curves."""
    s = ProbeSettings(heads=(1, 3), tokens=40, dtype="float32", points=16, scalings=())
    r = probe(ckpt, tmp_path, s, text=ckpt / "text.txt", progress=False, model=model)
    q, k = capture_qk(model, _ids(40), [0])[0]
    per_head = score_curves(q, k, from_hf(model.config), torch.tensor(r.data["distances"]), 8**-0.5)["full"]
    torch.testing.assert_close(torch.tensor(r.data["layers"]["0"]["curves"]["model"]["full"]), per_head[[1, 3]].mean(0))


def test_memory_estimate_is_the_weights_size(ckpt):
    """From the headers alone: the same bytes as the loaded tensors (float32 and bfloat16)."""
    from safetensors.torch import load_file

    tensors = load_file(str(ckpt / "model.safetensors"))
    numel = sum(t.numel() for t in tensors.values())
    c = open_checkpoint(ckpt)
    assert estimate_bytes(c, torch.float32) == 4 * numel
    assert estimate_bytes(c, torch.bfloat16) == 2 * numel
    with pytest.raises(ValueError, match=r"needs about .* GiB in bfloat16 .* only 0\.00 GiB of memory is available"):
        check_fits(c, torch.bfloat16, available=1000)
    assert check_fits(c, torch.float32, available=2**40) == 4 * numel


def test_too_large_is_refused_before_loading(ckpt, monkeypatch, capsys, tmp_path):
    """The CLI: one line, exit 2, and transformers never asked to load anything."""
    import posenc.hf.checkpoint as cp

    monkeypatch.setattr(cp, "available_memory", lambda: 1000)

    def boom(*a, **k):
        raise AssertionError("loaded despite the memory check")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    code = main(["probe", str(ckpt), "--out", str(tmp_path / "out"), "--tokens", "8", "--no-progress"])
    assert code == 2
    assert "of memory is available" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_report_model_section(ckpt, tmp_path):
    """`posenc report --model`: the probe's table and figure are in the page, the data under out/probe."""
    out = tmp_path / "report"
    assert main(["report", "--out", str(out), "--model", str(ckpt), "--encodings", "rope", "--plots", "rope-score"]) == 0
    page = (out / "report.html").read_text()
    assert "Checkpoint probe: " + ckpt.resolve().name in page and '<table id="probe">' in page
    data = json.loads((out / "probe" / "probe.json").read_text())
    assert data["text_tokens"] == L and data["text"] == "stdlib"  # default 512 tokens, capped at L
    assert page.count('alt="probe_layer0"') == 1
    win = data["layers"]["0"]["windows"]
    assert win["variants"]["model"] == win["full"]  # the model's row: the window means the verdicts read
    assert f"<td>model</td><td>{win['full'][0]:.4g}</td>" in page and '<table id="probe-verdicts">' in page


def test_dense_curves_in_chunks_equal_one_call(model):
    """dense_curve's chunks (8192 distances each) give the one-call curve, dynamic NTK included
    (each chunk carries the curve's last distance, so the current length is the whole curve's)."""
    from posenc.hf.probe import dense_curve

    q, k = capture_qk(model, _ids(40), [0])[0]
    rope = from_hf(model.config)
    last = 20_000
    for name, vr in variant_ropes(rope, L, 4.0, 16, ("dynamic",)).items():
        got = dense_curve(q, k, vr, 8**-0.5, torch.arange(4), last, frequency_halves(rope), ("full", "low"))
        ref = score_curves(q, k, vr, torch.arange(last + 1), 8**-0.5)
        for kind in ("full", "low"):
            torch.testing.assert_close(got[kind], ref[kind].double().mean(0), atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("family", ["llama", *FAMILIES])
def test_probe_runs_on_every_family_it_documents(family, tmp_path):
    """Every family layer_taps reads is loaded and probed end to end, its trained length read
    by posenc.hf.trained_length (GPT-J: n_positions)."""
    from posenc.hf import trained_length

    if family == "llama":
        cfg = _config()
    else:
        cls, extra = FAMILIES[family]
        kw = dict(_SMALL) if family != "gptj" else dict(vocab_size=260)
        if family == "phi3":  # Phi3Config's default trained length is 4096, whatever max_position_embeddings says
            extra = extra | {"original_max_position_embeddings": 64}
        cfg = getattr(transformers, cls)(**(kw | extra))
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    m.save_pretrained(tmp_path / "ckpt")
    s = ProbeSettings(tokens=16, points=8, dtype="float32", scalings=("linear",))
    # loaded from the folder as a user's run does (GPT-J: transformers has no SDPA path for it)
    r = probe(tmp_path / "ckpt", tmp_path / "out", s, progress=False)
    assert r.data["trained_length"] == trained_length(m.config) == 64
    assert set(r.data["layers"]["0"]["curves"]) == {"model", "base x16", "linear"}
    assert (tmp_path / "out" / "probe.json").is_file() and r.figures[0].is_file()
    if family == "gemma3_text":  # one layer of each type by default, each with its own base and trained distance
        got = {k: (e["layer_type"], e["rope"]["base"], e["trained_distance"]) for k, e in r.data["layers"].items()}
        assert got == {"0": ("sliding_attention", 10000.0, 32), "1": ("full_attention", 1e6, 64)}
        assert (tmp_path / "out" / "probe_layers.png").is_file()


def test_two_probes_into_one_out_are_refused(ckpt, model, tmp_path):
    """A second writer (here another process holding --out's lock, as a running probe or bench
    does) is refused before anything is written: the two never mix their files."""
    import subprocess
    import sys

    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from posenc.files import OutDirLock\n"
         f"with OutDirLock({str(out)!r}):\n    print('locked', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        s = ProbeSettings(tokens=16, points=8, dtype="float32", scalings=())
        with pytest.raises(ValueError, match=rf"--out {re.escape(str(out))} is in use by another posenc .*pid {holder.pid}"):
            probe(ckpt, out, s, progress=False, model=model)
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    finally:
        holder.kill()
        holder.wait()
    probe(ckpt, out, ProbeSettings(tokens=16, points=8, dtype="float32", scalings=()), progress=False, model=model)
    assert (out / "probe.json").is_file()


def test_text_that_is_a_directory_is_named_as_one(ckpt, model, tmp_path):
    s = ProbeSettings(tokens=16, points=8, dtype="float32", scalings=())
    with pytest.raises(ValueError, match=rf"^--text must be a text file, got {re.escape(repr(str(tmp_path)))}, "
                                         "which is a directory$"):
        probe(ckpt, tmp_path / "out", s, text=tmp_path, progress=False, model=model)


@pytest.mark.parametrize("cut", ["data", "header"])
def test_truncated_weights_are_refused_before_transformers_reads_them(ckpt, tmp_path, monkeypatch, cut):
    """A safetensors file cut short (intact header, or inside it) is one line naming the file,
    before transformers is asked to load (its SafetensorError traceback never shows)."""
    import shutil

    folder = tmp_path / "ckpt"
    shutil.copytree(ckpt, folder)
    weights = folder / "model.safetensors"
    raw = weights.read_bytes()
    header_end = 8 + int.from_bytes(raw[:8], "little")
    weights.write_bytes(raw[: header_end + 100] if cut == "data" else raw[: header_end - 10])

    def boom(*a, **k):
        raise AssertionError("transformers asked to load a truncated file")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    s = ProbeSettings(tokens=16, points=8, dtype="float32", scalings=())
    with pytest.raises(ValueError, match=rf"^{re.escape(str(weights))} is truncated: "):
        probe(folder, tmp_path / "out", s, progress=False)


def test_a_checkpoint_missing_a_weight_is_refused_not_filled_at_random(ckpt, tmp_path):
    """transformers initialises a weight the files lack at random (and only logs it); the probe
    (and bench --model, through the same load_model) refuses such a checkpoint."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "ckpt"
    shutil.copytree(ckpt, folder)
    state = load_file(str(folder / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    s = ProbeSettings(tokens=16, points=8, dtype="float32", scalings=())
    with pytest.raises(ValueError, match=r"lacks 1 weight\(s\) its llama model needs "
                                         r"\(model.layers.1.mlp.up_proj.weight\): the checkpoint is incomplete"):
        probe(folder, tmp_path / "out", s, progress=False)


def test_no_legend_of_the_layer_figure_covers_its_curves(monkeypatch, tmp_path):
    """The committed SmolLM2 probe drawn: each panel's legend lies outside its axes (the third
    panel has curves in every corner, where a legend inside covered them)."""
    from pathlib import Path

    import matplotlib
    import matplotlib.pyplot as plt

    from posenc.hf.probe.render import plot_layer

    matplotlib.use("Agg")
    data = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/results/probe_smollm2.json").read_text())
    figures = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    path = plot_layer(data, 0, tmp_path)
    assert path.is_file() and len(figures) == 1
    fig = figures[0]
    renderer = fig.canvas.get_renderer()
    axes = fig.get_axes()
    assert len(axes) == 3
    for ax in axes:
        legend, box = ax.get_legend(), ax.get_window_extent(renderer)
        assert legend is not None and len(legend.get_texts()) >= 2
        assert not legend.get_window_extent(renderer).overlaps(box), ax.get_title()
    assert fig.get_window_extent(renderer).contains(*axes[2].get_legend().get_window_extent(renderer).p0)
    matplotlib.pyplot.close(fig)
