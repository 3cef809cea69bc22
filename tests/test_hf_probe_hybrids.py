"""``posenc probe`` on NoPE/RoPE hybrids (SmolLM3, Llama 4, Cohere2): tiny random models built
with transformers.

A layer that does not rotate has no RoPE for the probe's curves (its score does not depend on
the distance through any rotation) and the probe's three claims are about RoPE, so the default
layers are the first RoPE layer of each layer type, and a ``--layer`` naming a NoPE layer is
refused in one line naming the layer and why. The layers probed are checked the way every
family is in ``tests/test_hf_probe.py``: the captured q and k, rotated by the layer's RoPE,
give the model's own attention probabilities.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5", reason="posenc.hf needs transformers>=5 (posenc[hf])")

from posenc.hf.probe import ProbeSettings, capture_qk, default_layers, layer_rope, layer_taps, probe  # noqa: E402
from posenc.rotary.hf_config import layer_ropes  # noqa: E402

T = 16
_SIZES = dict(vocab_size=260, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
              num_hidden_layers=4, max_position_embeddings=64, initializer_range=0.2, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
# windows and chunks as long as the text, so the eager attention below is plainly causal
FAMILIES = {  # model_type -> (config class, config kwargs, its NoPE layers)
    "smollm3": ("SmolLM3Config", {}, [3]),
    "llama4_text": ("Llama4TextConfig", dict(head_dim=8, intermediate_size_mlp=64, num_local_experts=2,
                                             attention_chunk_size=64, floor_scale=4, attn_scale=0.5), [3]),
    "cohere2": ("Cohere2Config", dict(sliding_window=64), [3]),
}


def make(name: str) -> torch.nn.Module:
    cls, kw, _ = FAMILIES[name]
    torch.manual_seed(0)
    cfg = getattr(transformers, cls)(**(_SIZES | kw))
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_default_layers_skip_nope_and_the_probed_layers_reproduce_attention(name):
    m = make(name)
    config = m.config.to_dict()
    nope = [i for i, r in enumerate(layer_ropes(config)) if r is None]
    assert nope == FAMILIES[name][2]
    # transformers' own flags: SmolLM3's and Llama 4's use_rope, Cohere2's RoPE on its windowed layers
    flags = [a.self_attn.use_rope if name != "cohere2" else a.self_attn.sliding_window is not None
             for a in m.model.layers]
    assert [i for i, f in enumerate(flags) if not f] == nope
    assert default_layers(config) == (0,)
    ids = torch.randint(3, 260, (1, T), generator=torch.Generator().manual_seed(1))
    rope_layers = [i for i in range(4) if i not in nope]
    got = capture_qk(m, ids, rope_layers)
    with torch.no_grad():
        ref = m(input_ids=ids, output_attentions=True).attentions
    pos, taps = torch.arange(T)[None], layer_taps(m)
    for layer in rope_layers:
        q, k = got[layer]
        qr, kr = layer_rope(config, layer).rotate(q[None], k[None], pos, pos)
        kr = kr.repeat_interleave(q.shape[0] // k.shape[0], dim=1)
        logits = qr @ kr.transpose(-1, -2) * taps[layer].scale
        logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(logits.softmax(-1), ref[layer].float(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_probe_runs_on_the_rope_layers_and_refuses_a_nope_layer(name, tmp_path):
    m = make(name)
    m.config.sliding_window = m.config.attention_chunk_size = 32  # Cohere2's window, Llama 4's chunk: below L
    m.save_pretrained(tmp_path / "ckpt")
    s = ProbeSettings(tokens=T, points=8, dtype="float32", scalings=("linear",))
    r = probe(tmp_path / "ckpt", tmp_path / "out", s, progress=False)
    assert list(r.data["layers"]) == ["0"] and (tmp_path / "out" / "probe.json").is_file()
    # the farthest the layer attends: Cohere2's window, Llama 4's chunk, else L
    assert r.data["layers"]["0"]["trained_distance"] == {"smollm3": 64}.get(name, 32)
    nope = FAMILIES[name][2][0]
    why = {"smollm3": r"no_rope_layers\[3\] is 0", "llama4_text": r"no_rope_layers\[3\] is 0",
           "cohere2": r"its 'full_attention' layers do not rotate"}[name]
    with pytest.raises(ValueError, match=rf"^--layer 3 of model_type '{name}' does not rotate \(NoPE: {why}\); the "
                                         r"probe measures RoPE's score against distance: probe one of its RoPE "
                                         r"layers 0-2$"):
        probe(tmp_path / "ckpt", tmp_path / "out2", ProbeSettings(layers=(0, nope), tokens=T, points=8,
                                                                    dtype="float32"), progress=False)
    assert not (tmp_path / "out2").exists()  # refused before anything is written
