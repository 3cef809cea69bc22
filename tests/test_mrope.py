"""mrope: M-RoPE (Qwen2-VL chunked, Qwen3-VL interleaved) against transformers on the same
inputs (``get_rope_index``'s position ids, the rotary embedding's cos/sin, a tiny random
Qwen2-VL attention layer on the same weights), against a slow loop over the formula, equal to
plain RoPE on text; multi-axis positions through the model (KV cache, packing, left padding)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import posenc
from posenc import Attention, SequenceInfo
from posenc.model import Transformer
from posenc.model_config import ModelConfig
from posenc.positions import multimodal_axes
from posenc.rotary.mrope import MRopeEmbedding, mrope_from_hf, mrope_pair_axes

transformers = pytest.importorskip("transformers")
from transformers.models.qwen2_vl import modeling_qwen2_vl as hf2  # noqa: E402
from transformers.models.qwen3_vl import modeling_qwen3_vl as hf3  # noqa: E402

F64 = torch.float64
#: Qwen2-VL's and Qwen3-VL's head (D = 128) and splits.
QWEN2 = dict(d_model=1536, num_heads=12, base=1e6, mrope_section=(16, 24, 24))
QWEN3 = dict(d_model=1536, num_heads=12, base=5e6, mrope_section=(24, 20, 20), mrope_interleaved=True)
BLOCKS = [3, (1, 2, 3), 2, (2, 2, 2), 1]  # text, an image, text, a 2-frame video, text


def _axes(blocks=BLOCKS, batch=1) -> torch.Tensor:
    return multimodal_axes(blocks)[:, None].expand(3, batch, -1)  # (3, B, T)


def _qk(B=2, H=12, T=None, D=128, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = _axes().shape[-1] if T is None else T
    return torch.randn(B, H, T, D, generator=g, dtype=dtype), torch.randn(B, H, T, D, generator=g, dtype=dtype)


# ---- the position ids: transformers' get_rope_index ------------------------------------------
def _hf_rope_index(input_types: list[list[int]], grids: list[tuple[int, int, int]], merge: int, mask=None):
    """transformers' Qwen2VLModel.get_rope_index on token types (0 text, 1 image), called with
    a stand-in ``self`` that holds only what it reads (the vision config's merge size)."""
    model = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=merge)))
    model.get_vision_position_ids = lambda *a, **k: hf2.Qwen2VLModel.get_vision_position_ids(model, *a, **k)
    types = torch.tensor(input_types)
    ids = torch.zeros_like(types)
    grid = torch.tensor([(t, h * merge, w * merge) for t, h, w in grids])  # before the merge
    return hf2.Qwen2VLModel.get_rope_index(model, ids, types, image_grid_thw=grid, attention_mask=mask)


def _types(blocks) -> list[int]:
    return [t for b in blocks for t in ([0] * b if isinstance(b, int) else [1] * math.prod(b))]


@pytest.mark.parametrize("merge", [1, 2])
def test_multimodal_axes_equal_transformers_get_rope_index(merge):
    blocks = [3, (1, 2, 3), 2, (1, 4, 2), 1]
    hf, delta = _hf_rope_index([_types(blocks)], [b for b in blocks if isinstance(b, tuple)], merge)
    ours = multimodal_axes(blocks)
    assert torch.equal(hf[:, 0], ours)
    # transformers' decoding rule (text at cache_position + delta) is SequenceInfo.next's.
    seq = SequenceInfo(torch.arange(ours.shape[1])[None], axes=ours[:, None])
    nxt = seq.next(2)
    want = torch.arange(ours.shape[1], ours.shape[1] + 2) + delta[0]
    assert torch.equal(nxt.axes, want.expand(3, 1, 2))


def test_multimodal_axes_left_padded_batch_equals_get_rope_index():
    rows = [[2, (1, 2, 2), 1], [1, (1, 3, 2), 3]]
    types = [_types(r) for r in rows]
    T = max(map(len, types))
    mask = torch.tensor([[0] * (T - len(t)) + [1] * len(t) for t in types])
    padded = [[0] * (T - len(t)) + t for t in types]
    grids = [b for r in rows for b in r if isinstance(b, tuple)]
    hf, _ = _hf_rope_index(padded, grids, 1, mask)
    seq = SequenceInfo.from_padding_mask(mask)
    axes = torch.zeros(3, 2, T, dtype=torch.long)
    for b, r in enumerate(rows):
        axes[:, b, mask[b].bool()] = multimodal_axes(r)
    assert torch.equal(hf, axes)
    seq = seq.with_axes(axes)
    assert seq.num_axes == 3


@pytest.mark.parametrize("tokens_per_second, seconds", [(2, (1.0, 0.5)), (25, (2 / 3, 0.25))])
def test_video_time_steps_equal_qwen2_5_vl_get_rope_index(tokens_per_second, seconds):
    """Qwen2.5-VL spaces a video's frames by tokens_per_second x second_per_grid_t (float32, as
    its processor returns second_per_grid_ts); images keep a time step of 1."""
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf25

    merge = 2
    vision = SimpleNamespace(spatial_merge_size=merge, tokens_per_second=tokens_per_second)
    model = SimpleNamespace(config=SimpleNamespace(vision_config=vision))
    model.get_vision_position_ids = lambda *a, **k: hf25.Qwen2_5_VLModel.get_vision_position_ids(model, *a, **k)
    sec = torch.tensor(seconds, dtype=torch.float32)
    videos, image = [(3, 2, 2), (4, 1, 3)], (1, 2, 3)
    # text, a video, text, an image, a video, text
    blocks = [2, videos[0], 1, image, videos[1], 3]
    types = [t for b, kind in zip(blocks, (0, 2, 0, 1, 2, 0)) for t in [kind] * (b if isinstance(b, int) else math.prod(b))]
    types = torch.tensor([types])
    hf, delta = hf25.Qwen2_5_VLModel.get_rope_index(
        model, torch.zeros_like(types), types,
        image_grid_thw=torch.tensor([(image[0], image[1] * merge, image[2] * merge)]),
        video_grid_thw=torch.tensor([(t, h * merge, w * merge) for t, h, w in videos]),
        second_per_grid_ts=sec,
    )
    interval = [float(tokens_per_second * s) for s in sec]  # each a float32 value, as transformers forms it
    ours = multimodal_axes([2, (*videos[0], interval[0]), 1, image, (*videos[1], interval[1]), 3])
    assert torch.equal(hf[:, 0], ours)
    assert not torch.equal(ours, multimodal_axes(blocks))  # the spacing is exercised: not the time step of 1
    # decoding continues at cache_position + rope_deltas: after the prompt's largest id on any axis
    T = ours.shape[1]
    nxt = SequenceInfo(torch.arange(T)[None], axes=ours[:, None]).next(2)
    assert torch.equal(nxt.axes, (torch.arange(T, T + 2) + delta[0]).expand(3, 1, 2))


def test_next_after_a_video_that_ends_the_text_continues_past_its_last_frame():
    # frames at 0, 12, 25, then one text token at max(h, w) = 1: the next token follows the
    # largest id (25), as transformers' rope_deltas put it, not the last token's (1)
    axes = multimodal_axes([(3, 1, 1, 12.5), 1])  # t: 0 12 25 1
    seq = SequenceInfo(torch.arange(4)[None], axes=axes[:, None])
    assert seq.next(2).axes[:, 0].tolist() == [[26, 27]] * 3
    # packed: only the last document counts; left padding: pads do not count
    packed = SequenceInfo(torch.tensor([[0, 1, 2, 0, 1]]), segment_ids=torch.tensor([[0, 0, 0, 1, 1]]),
                          axes=torch.tensor([[0, 40, 41, 0, 1]]).expand(3, 1, 5))
    assert packed.next(1).axes[:, 0].tolist() == [[2]] * 3
    padded = SequenceInfo.from_padding_mask(torch.tensor([[0, 1, 1]])).with_axes(torch.tensor([[[9, 0, 1]]]).expand(3, 1, 3))
    assert padded.next(1).axes[:, 0].tolist() == [[2]] * 3


def test_multimodal_axes_video_interval_by_hand():
    # frames at floor(i * 12.5): 0, 12, 25; rows and columns as without an interval; the text
    # after the video starts at start + max(h, w), as transformers places it
    got = multimodal_axes([1, (3, 1, 2, 12.5), 1])
    want = torch.tensor([[0, 1, 1, 13, 13, 26, 26, 3],
                         [0, 1, 1, 1, 1, 1, 1, 3],
                         [0, 1, 2, 1, 2, 1, 2, 3]])
    assert torch.equal(got, want)
    assert torch.equal(multimodal_axes([(2, 2, 2, 1.0)]), multimodal_axes([(2, 2, 2)]))


def test_multimodal_axes_bad_blocks():
    with pytest.raises(ValueError, match=r"\(t, h, w\) or \(t, h, w, interval\) tuple"):
        multimodal_axes([2, (1, 2)])
    for bad in (0, -1.0, float("nan"), float("inf"), "2", True):
        with pytest.raises(ValueError, match="vision block's interval must be a finite number > 0"):
            multimodal_axes([(2, 1, 1, bad)])
    with pytest.raises(ValueError, match=r"last frame time \(t - 1\) \* interval must be below 2\*\*24, got \(3 - 1\) \* 10000000\.0"):
        multimodal_axes([(3, 1, 1, 1e7)])
    with pytest.raises(ValueError, match="vision block's h must be >= 1"):
        multimodal_axes([(1, 0, 2)])
    with pytest.raises(ValueError, match="at least one"):
        multimodal_axes([])


# ---- the rotation: transformers' rotary embeddings -------------------------------------------
def _hf_rotary(cls, section, interleaved: bool, base: float):
    cfg = SimpleNamespace(
        max_position_embeddings=4096, hidden_size=1536, num_attention_heads=12, head_dim=128,
        rope_parameters={"rope_type": "default", "rope_theta": base, "mrope_section": list(section),
                         **({"mrope_interleaved": True} if interleaved else {})},
    )
    return cls(cfg)


@pytest.mark.parametrize(
    "config, hf_cls",
    [(QWEN2, hf2.Qwen2VLRotaryEmbedding), (QWEN3, hf3.Qwen3VLTextRotaryEmbedding)],
    ids=["qwen2_vl_chunked", "qwen3_vl_interleaved"],
)
def test_rotation_equals_transformers(config, hf_cls):
    """Same (3, B, T) position ids, same q and k: cos/sin and the rotated q, k of transformers'
    rotary embedding + apply_rotary_pos_emb (float32 angles there: atol 1e-5 at positions < 20)."""
    enc = posenc.build("mrope", **config)
    hf = _hf_rotary(hf_cls, config["mrope_section"], config.get("mrope_interleaved", False), config["base"])
    axes = _axes(batch=2)
    q, k = _qk()
    cos, sin = hf(q, axes)  # (B, T, D), rotate_half layout
    ours_cos, ours_sin = enc.cos_sin(axes)
    torch.testing.assert_close(torch.cat([ours_cos, ours_cos], -1).expand_as(cos), cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.cat([ours_sin, ours_sin], -1).expand_as(sin), sin, atol=1e-6, rtol=0)
    want_q, want_k = hf2.apply_rotary_pos_emb(q, k, cos, sin)
    got_q, got_k = enc.rotate(q, k, axes, axes)
    torch.testing.assert_close(got_q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k, want_k, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
def test_pair_axes_are_transformers_recomposition(interleaved):
    """Which axis each pair takes: transformers' recomposition on a tagged (3, 1, 1, P) input."""
    section = (24, 20, 20) if interleaved else (16, 24, 24)
    hf_cls = hf3.Qwen3VLTextRotaryEmbedding if interleaved else hf2.Qwen2VLRotaryEmbedding
    hf = _hf_rotary(hf_cls, section, interleaved, 1e4)
    tagged = torch.arange(3.0)[:, None, None, None].expand(3, 1, 1, 64).clone()  # axis a holds a
    got = hf.recomposition_frequencies(tagged)[0, 0, :64].long()
    assert torch.equal(got, mrope_pair_axes(section, interleaved))


def test_tiny_random_qwen2_vl_attention_layer_on_the_same_weights():
    """A 1-layer random Qwen2-VL text model (transformers), on an image + text sequence with
    get_rope_index's positions: its first attention layer's output equals posenc's Attention
    with mrope and the same weights."""
    cfg = transformers.Qwen2VLTextConfig(
        vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]},
        attn_implementation="eager", bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    torch.manual_seed(0)
    model = hf2.Qwen2VLTextModel(cfg).to(F64).eval()
    blocks = [2, (1, 3, 4), 3]
    types = _types(blocks)
    hf_pos, _ = _hf_rope_index([types], [blocks[1]], 1)
    seen = {}
    layer = model.layers[0].self_attn
    layer.register_forward_hook(lambda m, a, kw, out: seen.update(x=kw["hidden_states"], out=out[0]), with_kwargs=True)
    ids = torch.randint(0, 64, (1, len(types)), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(input_ids=ids, position_ids=hf_pos)

    enc = mrope_from_hf(cfg)
    assert enc.section == (2, 3, 3) and not enc.config.mrope_interleaved
    ours = Attention(64, 4, 2, pe=enc, impl="eager", bias=True).to(F64)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(ours, name).weight.copy_(getattr(layer, name).weight)
            hb = getattr(layer, name).bias
            getattr(ours, name).bias.copy_(torch.zeros_like(getattr(ours, name).bias) if hb is None else hb)
        seq = SequenceInfo(torch.arange(len(types))[None], axes=multimodal_axes(blocks)[:, None])
        got = ours(seen["x"], seq)
        text_only = ours(seen["x"], SequenceInfo(seq.positions))  # the same layer at 1-D positions
    # transformers makes float32 angles and cos/sin (then casts them to float64): 1.6e-9 apart here.
    torch.testing.assert_close(got, seen["out"], atol=2e-8, rtol=0)
    assert (text_only - seen["out"]).abs().max() > 1e-4  # the image's axes matter at this tolerance


@pytest.mark.parametrize("name", ["Qwen2VLConfig", "Qwen2_5_VLConfig", "Qwen3VLConfig"])
def test_from_hf_reads_the_default_multimodal_configs_as_transformers_builds_them(name):
    """posenc.rotary.from_hf on each family's default config: the text model's head, theta and
    sections, as the family's rotary embedding reads them (its default section when absent)."""
    from posenc.rotary import from_hf

    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf25

    cfg = getattr(transformers, name)()
    rotary = {"Qwen2VLConfig": hf2.Qwen2VLRotaryEmbedding, "Qwen2_5_VLConfig": hf25.Qwen2_5_VLRotaryEmbedding,
              "Qwen3VLConfig": hf3.Qwen3VLTextRotaryEmbedding}[name]
    hf_rotary = rotary(cfg.text_config)
    enc = from_hf(cfg.to_dict())
    assert isinstance(enc, MRopeEmbedding)
    assert list(enc.section) == list(hf_rotary.mrope_section)
    assert enc.config.mrope_interleaved == (name == "Qwen3VLConfig")
    torch.testing.assert_close(enc.inv_freq.float(), hf_rotary.inv_freq, atol=0, rtol=1e-6)


def test_mrope_from_hf_reads_qwen3_vl_as_interleaved():
    cfg = transformers.Qwen3VLTextConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [4, 2, 2]},
    )
    enc = mrope_from_hf(cfg)
    assert enc.config.mrope_interleaved and enc.section == (4, 2, 2) and enc.config.base == 5e6
    with pytest.raises(ValueError, match="no mrope_section in its rope parameters"):
        mrope_from_hf({"hidden_size": 64, "num_attention_heads": 4, "rope_parameters": {"rope_theta": 1e4}})
    with pytest.raises(ValueError, match="rope_type must be 'default'"):
        mrope_from_hf({"hidden_size": 64, "num_attention_heads": 4,
                       "rope_parameters": {"rope_type": "yarn", "mrope_section": [2, 3, 3]}})


# ---- the formula --------------------------------------------------------------------------
def _slow_rotate(x: torch.Tensor, axes: torch.Tensor, section, interleaved: bool, base: float) -> torch.Tensor:
    """Pair by pair, token by token: pair j of the half layout (channels j, j + P) turns by
    axes[axis(j)] * base^(-2j/D), axis(j) from the paper's chunks or Qwen3-VL's interleaving."""
    B, H, T, D = x.shape
    P = D // 2
    out = x.clone()
    for j in range(P):
        if interleaved:
            a = 1 if j % 3 == 1 and j < 3 * section[1] else 2 if j % 3 == 2 and j < 3 * section[2] else 0
        else:
            a = 0 if j < section[0] else 1 if j < section[0] + section[1] else 2
        theta = base ** (-2 * j / D)
        for b in range(B):
            for t in range(T):
                ang = float(axes[a, b, t]) * theta
                c, s = math.cos(ang), math.sin(ang)
                x1, x2 = x[b, :, t, j], x[b, :, t, j + P]
                out[b, :, t, j], out[b, :, t, j + P] = x1 * c - x2 * s, x2 * c + x1 * s
    return out


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotation_equals_slow_loop_over_the_formula(interleaved):
    section = (4, 2, 2) if interleaved else (2, 3, 3)
    enc = posenc.build("mrope", d_model=32, num_heads=2, mrope_section=section, mrope_interleaved=interleaved)
    axes = torch.stack([_axes(batch=1)[:, 0], _axes([1, (2, 3, 2), 7])[:, 0]], dim=1)
    q, k = _qk(B=2, H=2, D=16, dtype=F64)
    got_q, got_k = enc.rotate(q, k, axes, axes)
    # posenc's cos/sin tables are float32 (float64 angles): 1e-6 at |x| ~ 3.
    torch.testing.assert_close(got_q, _slow_rotate(q, axes, section, interleaved, 1e4), atol=1e-6, rtol=0)
    torch.testing.assert_close(got_k, _slow_rotate(k, axes, section, interleaved, 1e4), atol=1e-6, rtol=0)


@pytest.mark.parametrize("config", [QWEN2, QWEN3], ids=["chunked", "interleaved"])
def test_text_only_equals_plain_rope_exactly(config):
    """Equal axes (text) and positions without axes both give RoPE's rotation, bit for bit."""
    enc = posenc.build("mrope", **config)
    rope = posenc.build("rope", d_model=1536, num_heads=12, base=config["base"])
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [5, 6, 7, 8, 9, 10, 300, 301]])
    q, k = _qk(T=8)
    want = rope.rotate(q, k, pos, pos)
    for p in (pos, pos.expand(3, -1, -1)):
        got = enc.rotate(q, k, p, p)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    text = posenc.build("mrope", **config)
    model_pos = SequenceInfo(pos, axes=pos.expand(3, -1, -1))
    assert torch.equal(text.position_ids(model_pos), model_pos.axes)


def test_logits_depend_on_the_three_differences_only():
    """Shifting every token's time, height and width by three different offsets leaves q·k."""
    enc = posenc.build("mrope", **QWEN2)
    axes = _axes(batch=1)
    q, k = _qk(B=1, dtype=F64)
    shift = torch.tensor([7, 100, 31])[:, None, None]
    logits = lambda a: torch.einsum("bhid,bhjd->bhij", *enc.rotate(q, k, a, a))  # noqa: E731
    torch.testing.assert_close(logits(axes + shift), logits(axes), atol=1e-5, rtol=1e-5)  # float32 cos/sin
    # ...and moving one axis of some tokens changes them.
    moved = axes.clone()
    moved[0, :, 5:] += 5  # time: the highest frequencies in the chunked split
    assert (logits(moved) - logits(axes)).abs().max() > 1e-2


# ---- multi-axis positions through the model ------------------------------------------------
def _model(**over) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=48, n_layer=2, n_head=2, n_kv_head=1, encoding="mrope",
                      encoding_config={"mrope_section": (4, 4, 4)}, **over)
    return Transformer(cfg).to(F64).eval()


def test_kv_cache_decoding_with_axes_equals_the_full_forward():
    model = _model()
    axes = _axes(batch=2)
    T = axes.shape[-1]
    tokens = torch.randint(0, 64, (2, T + 3), generator=torch.Generator().manual_seed(0))
    prompt = SequenceInfo(torch.arange(T).expand(2, -1), axes=axes)
    full_seq = SequenceInfo(torch.arange(T + 3).expand(2, -1), axes=torch.cat([axes, prompt.next(3).axes], dim=2))
    with torch.no_grad():
        full = model(tokens, full_seq)
        cache = model.new_cache()
        steps = [model(tokens[:, :T], prompt, cache=cache)]
        for i in range(3):
            steps.append(model(tokens[:, T + i : T + i + 1], cache=cache))  # cache.seq.next(1): the axes continue
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-10, rtol=1e-10)
    assert cache.seq.axes.shape == (3, 2, T + 3)
    with pytest.raises(ValueError, match="carry 3 position axes but the new ones 1"):
        model(tokens[:, :1], SequenceInfo.from_offset(2, 1, T + 3), cache=cache)


def test_packed_documents_with_axes_equal_separate_forwards():
    model = _model()
    docs = [[2, (1, 2, 3), 1], [4], [(1, 3, 3), 2]]
    axes = [multimodal_axes(d) for d in docs]
    lens = [a.shape[1] for a in axes]
    tokens = torch.randint(0, 64, (1, sum(lens)), generator=torch.Generator().manual_seed(0))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    packed = SequenceInfo.from_cu_seqlens(cu).with_axes(torch.cat(axes, dim=1)[:, None])
    with torch.no_grad():
        together = model(tokens, packed)
        apart = [model(tokens[:, a:z], SequenceInfo(torch.arange(z - a)[None], axes=ax[:, None]))
                 for a, z, ax in zip(cu[:-1].tolist(), cu[1:].tolist(), axes)]
    torch.testing.assert_close(together, torch.cat(apart, dim=1), atol=1e-10, rtol=1e-10)


def test_left_padded_batch_with_axes_equals_unpadded_rows():
    model = _model()
    rows = [[2, (1, 2, 2), 1], [1, (1, 3, 2), 3]]
    axes = [multimodal_axes(r) for r in rows]
    T = max(a.shape[1] for a in axes)
    mask = torch.tensor([[0] * (T - a.shape[1]) + [1] * a.shape[1] for a in axes])
    full_axes = torch.zeros(3, 2, T, dtype=torch.long)
    for b, a in enumerate(axes):
        full_axes[:, b, T - a.shape[1]:] = a
    tokens = torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        padded = model(tokens, SequenceInfo.from_padding_mask(mask).with_axes(full_axes))
        for b, a in enumerate(axes):
            n = a.shape[1]
            alone = model(tokens[b : b + 1, T - n:], SequenceInfo(torch.arange(n)[None], axes=a[:, None]))
            torch.testing.assert_close(padded[b : b + 1, T - n:], alone, atol=1e-10, rtol=1e-10)


# ---- bad configs and positions ------------------------------------------------------------
@pytest.mark.parametrize(
    "config, error, match",
    [
        ({"mrope_section": (16, 24)}, ValueError, "3 entries"),
        ({"mrope_section": (16, -1, 49)}, ValueError, "height entry must be >= 0"),
        ({"mrope_section": (16, 24, 25)}, ValueError, "sum to the rotated pairs rotary_dim / 2 = 64"),
        ({"mrope_section": (4, 30, 30), "mrope_interleaved": True}, ValueError, "does not fit 64 interleaved"),
        ({"mrope_section": "16,24,24"}, TypeError, "mrope_section"),
        ({"mrope_interleaved": 1}, TypeError, "mrope_interleaved must be a bool"),
    ],
)
def test_config_refuses_bad_values_by_name(config, error, match):
    with pytest.raises(error, match=match):
        posenc.build("mrope", d_model=1536, num_heads=12, **config)


def test_default_sections_scale_qwen_splits_down_to_tiny_heads():
    from posenc.rotary.mrope import default_mrope_section

    assert default_mrope_section(64, False) == (16, 24, 24) and default_mrope_section(64, True) == (24, 20, 20)
    assert default_mrope_section(2, False) == (0, 1, 1) and default_mrope_section(2, True) == (2, 0, 0)
    assert posenc.build("mrope", d_model=8, num_heads=2).section == (0, 1, 1)


def test_positions_with_other_axes_are_refused():
    enc = posenc.build("mrope", **QWEN2)
    with pytest.raises(ValueError, match="mrope reads 3 position axes"):
        enc.position_ids(SequenceInfo.from_grid(2, 3))
    q, k = _qk(T=4)
    with pytest.raises(ValueError, match=r"shape \(B, T\) or \(3, B, T\)"):
        enc.rotate(q, k, torch.zeros(2, 2, 4, dtype=torch.long), torch.zeros(2, 2, 4, dtype=torch.long))


def test_sequence_info_checks_axes():
    pos = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"axes must have shape \(A, B, T\) = \(A, 2, 5\)"):
        SequenceInfo(pos, axes=torch.zeros(3, 2, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="axes must be an integer tensor"):
        SequenceInfo(pos, axes=torch.zeros(3, 2, 5))
    with pytest.raises(ValueError, match="axes must be >= 0, got a minimum of -1"):
        SequenceInfo(pos, axes=torch.full((3, 2, 5), -1))
    with pytest.raises(TypeError, match="axes must be an"):
        SequenceInfo(pos, axes=[[0] * 5] * 2)
    grid = SequenceInfo.from_grid(2, 3, batch=2)
    assert grid.axes[:, 0].tolist() == [[0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2]] and grid.num_axes == 2
    assert SequenceInfo.from_offset(1, 3).num_axes == 1


# ---- the figure ----------------------------------------------------------------------------
def test_figure_centre_patch_logits_show_each_splits_axes(tmp_path):
    """At Qwen2-VL's base 1e6 the chunked split leaves the width axis only the lowest
    frequencies: the centre patch's logits barely change along a row; interleaved, they change
    along rows and columns alike. Both peak at the centre."""
    from posenc.analysis.fig_mrope import grid_logits, plot_mrope_axes

    chunked = grid_logits(16, 16)
    inter = grid_logits(16, 16, mrope_interleaved=True)
    along_row = lambda z: float(z[8].max() - z[8].min())  # noqa: E731  (the centre's row: width varies)
    along_col = lambda z: float(z[:, 8].max() - z[:, 8].min())  # noqa: E731
    assert along_row(chunked) < 0.05 * along_col(chunked)
    assert 0.5 < along_row(inter) / along_col(inter) < 2
    for z in (chunked, inter):
        assert float(z[8, 8]) == pytest.approx(float(z.max()))
    pytest.importorskip("matplotlib")
    result = plot_mrope_axes(tmp_path, height=6, width=6)
    assert result.path.exists() and result.data["axes"].shape == (3, 32)


# ---- patch_model: a transformers Qwen2-VL language model rotating with posenc's mrope ----------
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_patch_model_runs_a_tiny_random_vl_language_model_with_mrope(family):
    """A 2-layer random Qwen2-VL / Qwen3-VL text model (transformers) on an image + text
    sequence: patched, its hidden states equal its own (float32 angles there: 1e-5); a base
    override (through MRopeConfig) changes them; unpatched, bit for bit its own again."""
    from posenc.hf.patch import patch_model, patched_rope, unpatch_model

    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2]}
    if family == "qwen2_vl":
        cfg = transformers.Qwen2VLTextConfig(
            vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rope_parameters=rope, bos_token_id=None, eos_token_id=None, pad_token_id=None)
        model_cls = hf2.Qwen2VLTextModel
    else:
        cfg = transformers.Qwen3VLTextConfig(
            vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rope_parameters=rope | {"mrope_interleaved": True},
            bos_token_id=None, eos_token_id=None, pad_token_id=None)
        model_cls = hf3.Qwen3VLTextModel
    torch.manual_seed(0)
    model = model_cls(cfg).eval()
    blocks = [2, (1, 3, 4), 3]
    pos = multimodal_axes(blocks)[:, None]  # (3, 1, T): get_rope_index's, tested above
    ids = torch.randint(0, 64, (1, pos.shape[-1]), generator=torch.Generator().manual_seed(1))
    run = lambda: model(input_ids=ids, position_ids=pos).last_hidden_state  # noqa: E731
    with torch.no_grad():
        own = run()
        enc = patch_model(model)
        assert isinstance(enc, MRopeEmbedding) and enc.config.mrope_interleaved == (family == "qwen3_vl")
        patched = run()
        patch_model(model, base=1e3)
        assert patched_rope(model).config.base == 1e3 and patched_rope(model).section == (4, 2, 2)
        other_base = run()
        assert unpatch_model(model)
        back = run()
    torch.testing.assert_close(patched, own, atol=1e-5, rtol=1e-5)
    assert (other_base - own).abs().max() > 1e-3
    assert torch.equal(back, own)
