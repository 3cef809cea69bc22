"""model.py: Transformer wiring (shared encodings, where absolute positions enter), generate, and the
forward's input checks."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import AttentionContext, ModelConfig, SequenceInfo, Transformer


def test_shared_specs_resolve_to_one_module():
    cfg = ModelConfig(d_model=32, n_head=4, n_layer=3, encoding="learned")
    assert len(Transformer(cfg).encodings) == 1
    cfg = ModelConfig(d_model=32, n_head=4, n_layer=3, encoding="learned", share_encoding=False)
    assert len(Transformer(cfg).encodings) == 3
    cfg = ModelConfig(d_model=32, n_head=4, n_layer=3, layer_encodings=("learned", None, "sinusoidal"))
    m = Transformer(cfg)
    assert len(m.encodings) == 2 and m.encoding_of(1) is None
    assert m.encoding_of(0) is m.encodings[0] and m.encoding_of(2) is m.encodings[1]
    assert all(b.attn.pe is None for b in m.blocks)  # the model owns the encodings, not the layers


def test_shared_encoding_appears_once_in_state_dict():
    cfg = ModelConfig(d_model=32, n_head=4, n_layer=3, encoding="learned")
    m = Transformer(cfg)
    keys = [k for k in m.state_dict() if "weight" in k and m.state_dict()[k].shape == (1024, 32)]
    assert keys == ["encodings.0.weight"]
    assert all(m.encoding_of(i) is m.encodings[0] for i in range(3))


@pytest.mark.parametrize("before_last", [0, 1, 3])
def test_absolute_before_last_layers_is_where_positions_enter(before_last):
    """DeBERTa's enhanced mask decoder: absolute positions enter before the last N layers.
    Reference: run the blocks by hand and add PE(p) at layer n_layer - N."""
    cfg = ModelConfig(d_model=32, n_head=4, n_layer=3, causal=False, encoding="sinusoidal",
                      absolute_before_last=before_last)
    m = Transformer(cfg).eval()
    tokens = torch.randint(0, 256, (2, 6))
    seq = SequenceInfo.from_offset(2, 6)
    ctx = AttentionContext.build(seq, causal=False)
    pe = posenc.absolute.sinusoidal_table(seq.positions, 32)  # (B, T, C)
    with torch.no_grad():
        x = m.tok_emb(tokens)
        for i, block in enumerate(m.blocks):
            if i == 3 - before_last:
                x = x + pe
            x = block(x, ctx, ctx.prepare(None), None, i)
        if before_last == 0:
            x = x + pe
        ref = m.head(m.ln_f(x))
        torch.testing.assert_close(m(tokens), ref)


def test_generate_matches_step_by_step_argmax():
    model = Transformer(ModelConfig(d_model=32, n_head=4, n_layer=2, encoding="sinusoidal")).eval()
    prompt = torch.randint(0, 256, (2, 5))
    out = model.generate(prompt, 4)
    seq = prompt
    for _ in range(4):  # reference: full forward on the whole prefix every step, no cache
        nxt = model(seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(out, seq)


def test_model_input_errors():
    model = Transformer(ModelConfig(d_model=32, n_head=4, n_layer=1, encoding="none"))
    with pytest.raises(ValueError, match="tokens must have shape"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="positions have shape"):
        model(torch.zeros(1, 3, dtype=torch.long), SequenceInfo.from_offset(1, 4))
    with pytest.raises(ValueError, match="either tokens or inputs_embeds"):
        model(torch.zeros(1, 3, dtype=torch.long), inputs_embeds=torch.zeros(1, 3, 32))


def _model(**over):
    return Transformer(ModelConfig(vocab_size=50, d_model=32, n_head=4, n_layer=1, encoding="rope", **over))


@pytest.mark.parametrize("bad", [50, 1000, -1])
def test_forward_refuses_token_ids_outside_the_vocabulary(bad):
    tokens = torch.tensor([[1, 2, bad, 3]])
    with pytest.raises(ValueError, match=rf"tokens must be in \[0, 50\) \(vocab_size\), got {bad}$"):
        _model()(tokens)


def test_forward_refuses_float_tokens_and_other_types():
    with pytest.raises(TypeError, match=r"tokens must be an integer tensor of token ids, got torch.float32"):
        _model()(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(TypeError, match=r"tokens must be an integer tensor of token ids, got torch.bool"):
        _model()(torch.tensor([[True, False]]))
    with pytest.raises(ValueError, match=r"tokens must have shape \(B, T\), got list"):
        _model()([[1, 2]])
    with pytest.raises(TypeError, match=r"seq must be a SequenceInfo or None, got Tensor"):
        _model()(torch.tensor([[1, 2]]), torch.tensor([[0, 1]]))


def test_forward_refuses_positions_on_another_device():
    seq = SequenceInfo(torch.zeros(1, 3, dtype=torch.long, device="meta"))
    with pytest.raises(ValueError, match=r"seq is on meta but the tokens are on cpu"):
        _model()(torch.tensor([[1, 2, 3]]), seq)
    with pytest.raises(ValueError, match=r"tokens are on meta but the model is on cpu"):
        _model()(torch.zeros(1, 3, dtype=torch.long, device="meta"))


def test_forward_refuses_inputs_embeds_of_another_dtype():
    # float64 embeddings through a float32 model would give float64 logits of float32 math.
    model = _model()
    with pytest.raises(TypeError, match=r"inputs_embeds must have the model's dtype torch.float32, got torch.float64"):
        model(None, inputs_embeds=torch.zeros(1, 3, 32, dtype=torch.float64))
    model64 = _model().double()
    x = torch.randn(1, 3, 32, dtype=torch.float64)
    assert model64(None, inputs_embeds=x).dtype == torch.float64


def test_generate_refuses_an_empty_prompt():
    with pytest.raises(ValueError, match=r"tokens must be a \(B, T\) tensor with T >= 1 \(the prompt\), got \(2, 0\)"):
        _model().generate(torch.zeros(2, 0, dtype=torch.long), 3)


@pytest.mark.parametrize("scale", [None, 0.02])
def test_embed_scale_runs_the_embed_hook_in_scaled_coordinates(scale):
    """embed_scale=s: x -> s * embed(x / s). For sinusoidal's added code c that is x + s * c
    (reference: the table written out); the recurrent GRU reads x / s (reference: its own
    embed called on the scaled input)."""
    from posenc.absolute import sinusoidal_table

    tokens = torch.randint(0, 256, (2, 6))
    seq = SequenceInfo.from_offset(2, 6)
    s = 1.0 if scale is None else scale
    m = Transformer(ModelConfig(d_model=32, n_head=4, n_layer=1, encoding="sinusoidal", embed_scale=scale)).eval()
    with torch.no_grad():
        x = m.tok_emb(tokens)
        want = x + s * sinusoidal_table(seq.positions, 32)  # (B, T, C)
        torch.testing.assert_close(m.embed_positions(x, seq, None), want)
    g = Transformer(ModelConfig(d_model=32, n_head=4, n_layer=1, encoding="recurrent", embed_scale=scale)).eval()
    pe = g.encodings[0]
    with torch.no_grad():
        x = g.tok_emb(tokens)
        assert torch.equal(g.embed_positions(x, seq, None), pe.embed(x / s, seq, None) * s)
