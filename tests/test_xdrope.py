"""XD-RoPE (HunYuan-VL's "xdrope") in posenc: ``xdrope_axes`` (4 rows: position, width, height,
image) and the ``xdrope`` encoding (consecutive sections of the pairs per axis), each against a
plain-Python re-derivation of the engine code that serves it:

* position ids: vLLM's ``HunYuanVLForConditionalGeneration.get_xdrope_input_positions``,
  vllm/model_executor/models/hunyuan_vision.py at commit 1c1b86e1664b8b04423ffc4102f6dd922a97ecbf,
  and transformers' ``HunYuanVLModel.get_rope_index`` (src/transformers/models/hunyuan_vl/
  modeling_hunyuan_vl.py at 075b5a603d6a23fad0360dd1600064fe2e1be83c), one sequence;
* pair-to-axis rule: vLLM's ``XDRotaryEmbedding.forward_native``
  (vllm/model_executor/layers/rotary_embedding/xdrope.py at b91ee1b47c8e8462ada5e5b8d18244bc96a0ebbc):
  the cos and sin halves of ``cos_sin_cache[positions]`` split by ``xdrope_section``, chunk i
  from axis i; frequencies of ``DynamicNTKAlphaRotaryEmbedding`` (base * alpha^(r/(r-2)));
* config keys: vLLM's ``get_rope`` builds it for ``rope_scaling`` type "xdrope" with
  ``alpha`` and ``xdrope_section``; transformers 5 renames them to "dynamic" / ``mrope_section``.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc import SequenceInfo
from posenc.model import Transformer
from posenc.model_config import ModelConfig
from posenc.positions import xdrope_axes
from posenc.rotary import from_hf
from posenc.rotary.xdrope import default_xdrope_section, xdrope_from_hf, xdrope_pair_axes
from tests.axes_reference import slow_axes_logits

F64 = torch.float64
TEXT, IMAGE_START, IMAGE, IMAGE_END = 7, 100, 102, 101  # placeholder ids: <hy_place_holder_no_100/102/101>


# ---- the engine's position ids, re-derived as plain loops --------------------------------------------
def _vllm_positions(tokens: list[int], grids: list[tuple[int, int, int]], merge: int, xd_num: int = 4):
    """get_xdrope_input_positions (vLLM hunyuan_vision.py @ 1c1b86e): every row arange(T); image k's
    grid from its image-start index + 2, (w + 1) h tokens: width = column, height = row, t = k."""
    n = len(tokens)
    p, w_ids, h_ids, t_ids = (list(range(n)) for _ in range(4))
    starts = [i for i, tok in enumerate(tokens) if tok == IMAGE_START]
    for k, s in enumerate(starts):
        pos = s + 2
        _, h, w = grids[k]
        gh, gw = h // merge, w // merge
        for i in range((gw + 1) * gh):
            w_ids[pos + i] = i % (gw + 1)
            h_ids[pos + i] = i // (gw + 1)
            t_ids[pos + i] = k
    return [p, w_ids, h_ids, t_ids] if xd_num == 4 else [w_ids, h_ids, t_ids]


def _transformers_positions(tokens: list[int], grids, merge: int, num_axes: int = 4):
    """get_rope_index (transformers modeling_hunyuan_vl.py @ 075b5a6), one sequence: each run of
    image tokens (mm_token_type_ids == 1) is one image; a run of grid + 2 tokens puts the grid
    after its first token; the last three rows take (column, row, image ordinal)."""
    n = len(tokens)
    ids = [list(range(n)) for _ in range(num_axes)]
    runs, i = [], 0
    while i < n:
        if tokens[i] == IMAGE:
            j = i
            while j < n and tokens[j] == IMAGE:
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    for k, (a, b) in enumerate(runs):
        _, h, w = grids[k]
        gh, gw = h // merge, w // merge
        grid = gh * (gw + 1)
        start = a + 1 if b - a == grid + 2 else a
        off = num_axes - 3
        for t in range(grid):
            ids[off][start + t] = t % (gw + 1)
            ids[off + 1][start + t] = t // (gw + 1)
            ids[off + 2][start + t] = k
    return ids


def _prompt(items, merge: int):
    """Tokens, grids before the merge and posenc's blocks of a prompt; items ("text", n) or
    ("image", (h, w)) after the merge. An image is image-start, h (w + 1) + 2 image tokens (the
    vision tower's begin, rows with newlines, end), image-end."""
    tokens, grids, blocks = [], [], []
    for kind, what in items:
        if kind == "text":
            tokens += [TEXT] * what
            blocks.append(what)
            continue
        h, w = what
        grids.append((1, h * merge, w * merge))
        tokens += [IMAGE_START] + [IMAGE] * (h * (w + 1) + 2) + [IMAGE_END]
        blocks += [1, what, 1]
    return tokens, grids, blocks


MIXES = {
    "one_image": [("text", 3), ("image", (2, 3)), ("text", 2)],
    "two_images": [("text", 1), ("image", (3, 2)), ("text", 4), ("image", (1, 5)), ("text", 1)],
    "images_back_to_back": [("image", (2, 2)), ("image", (4, 1))],
    "text_only": [("text", 6)],
}


@pytest.mark.parametrize("merge", [1, 2])
@pytest.mark.parametrize("mix", sorted(MIXES))
def test_ids_equal_vllm_and_transformers_on_text_image_mixes(mix, merge):
    tokens, grids, blocks = _prompt(MIXES[mix], merge)
    got = xdrope_axes(blocks)
    assert got.dtype == torch.long and got.shape == (4, len(tokens))
    assert torch.equal(got, torch.tensor(_vllm_positions(tokens, grids, merge)))
    assert torch.equal(got, torch.tensor(_transformers_positions(tokens, grids, merge)))
    three = xdrope_axes(blocks, num_axes=3)  # the engine's xd_num == 3: (width, height, image)
    assert torch.equal(three, torch.tensor(_vllm_positions(tokens, grids, merge, xd_num=3)))
    assert torch.equal(three, torch.tensor(_transformers_positions(tokens, grids, merge, num_axes=3)))


def test_ids_by_hand():
    got = xdrope_axes([1, (2, 2), 1])  # the docstring's example
    assert got.tolist() == [list(range(10)), [0, 1, 0, 1, 2, 0, 1, 2, 8, 9], [0, 1, 0, 0, 0, 1, 1, 1, 8, 9],
                            [0, 1, 0, 0, 0, 0, 0, 0, 8, 9]]
    assert torch.equal(xdrope_axes([3, 2]), torch.arange(5).expand(4, -1))


def test_decoding_continues_at_the_index_as_the_engine():
    """vLLM's get_next_input_positions: range(context_len, seq_len) on every axis, which is
    SequenceInfo.next's rule here (no grid id exceeds its token's index)."""
    prompt = xdrope_axes([2, (3, 4), 1])
    T = prompt.shape[1]
    nxt = SequenceInfo(torch.arange(T)[None], axes=prompt[:, None]).next(3)
    assert nxt.axes[:, 0].tolist() == [list(range(T, T + 3))] * 4
    assert torch.equal(xdrope_axes([2, (3, 4), 4])[:, T:], nxt.axes[:, 0])


# ---- the pairs: the engine's sections ----------------------------------------------------------------
def _vllm_cos_sin(ids: list[list[int]], section, inv_freq: list[float]):
    """forward_native's recomposition: cos_sin_cache[positions] (A, T, 2P) chunked into cos, sin
    (A, T, P), split by the section, chunk i from axis i; float64 here."""
    T = len(ids[0])
    cos = [[0.0] * len(inv_freq) for _ in range(T)]
    sin = [[0.0] * len(inv_freq) for _ in range(T)]
    col = 0
    for i, width in enumerate(section):
        for j in range(col, col + width):
            for t in range(T):
                cos[t][j] = math.cos(ids[i][t] * inv_freq[j])
                sin[t][j] = math.sin(ids[i][t] * inv_freq[j])
        col += width
    return torch.tensor(cos, dtype=F64), torch.tensor(sin, dtype=F64)


@pytest.mark.parametrize("section", [(16, 16, 16, 16), (4, 4, 4, 4), (2, 3, 1, 2), (0, 4, 2, 2), (3, 3, 2)])
def test_pair_axes_and_cos_sin_are_the_engines(section):
    P = sum(section)
    assert xdrope_pair_axes(section).tolist() == [i for i, n in enumerate(section) for _ in range(n)]
    enc = posenc.build("xdrope", d_model=4 * P, num_heads=2, xdrope_section=section, scaling="ntk_alpha", alpha=50.0)
    assert enc.section == section and enc.num_axes == len(section)
    ids = xdrope_axes([2, (2, 3), 3], num_axes=len(section))
    cos, sin = enc.cos_sin(ids[:, None])
    # vLLM DynamicNTKAlphaRotaryEmbedding: base * alpha ** (r / (r - 2)), inv_freq = 1 / base ** (2j / r)
    r = 2 * P
    base = 10000.0 * 50.0 ** (r / (r - 2))
    want_cos, want_sin = _vllm_cos_sin(ids.tolist(), section, [base ** (-2 * j / r) for j in range(P)])
    torch.testing.assert_close(cos[0].double(), want_cos, atol=1e-7, rtol=0)
    torch.testing.assert_close(sin[0].double(), want_sin, atol=1e-7, rtol=0)


# ---- the rotation ------------------------------------------------------------------------------------
def _slow_logits(q, k, ids: list[list[int]], section, base: float):
    """q·k after the slow per-pair rotation (tests/axes_reference.py), the axis from the section as the engine splits it."""
    return slow_axes_logits(q, k, ids, [i for i, n in enumerate(section) for _ in range(n)], base)


def test_logits_equal_the_slow_loop_on_a_text_image_mix():
    section = (2, 2, 2, 2)
    axes = xdrope_axes([2, (2, 3), 1, (1, 2), 2])
    enc = posenc.build("xdrope", d_model=32, num_heads=2, base=1e4, xdrope_section=section)
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, axes.shape[1], 16, generator=g, dtype=F64) for _ in range(2))
    got = torch.einsum("bhid,bhjd->bhij", *enc.rotate(q, k, axes[:, None], axes[:, None]))
    # posenc's cos/sin tables are float32 (float64 angles): 1e-5 on logits of 16 terms
    torch.testing.assert_close(got, _slow_logits(q, k, axes.tolist(), section, 1e4), atol=1e-5, rtol=0)


def test_logits_depend_on_the_four_differences_only():
    enc = posenc.build("xdrope", d_model=64, num_heads=2, xdrope_section=(4, 4, 4, 4))
    axes = xdrope_axes([3, (2, 3), 2])[:, None]
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 2, axes.shape[-1], 32, generator=g, dtype=F64) for _ in range(2))
    logits = lambda a: torch.einsum("bhid,bhjd->bhij", *enc.rotate(q, k, a, a))  # noqa: E731
    shift = torch.tensor([7, 100, 31, 5])[:, None, None]
    torch.testing.assert_close(logits(axes + shift), logits(axes), atol=1e-5, rtol=1e-5)
    for a in range(4):  # moving one axis of some tokens changes them
        moved = axes.clone()
        moved[a, :, 4:] += 3
        assert (logits(moved) - logits(axes)).abs().max() > 1e-2


def test_text_only_equals_plain_rope_exactly():
    enc = posenc.build("xdrope", d_model=256, num_heads=2, scaling="ntk_alpha", alpha=1000.0)
    rope = posenc.build("rope", d_model=256, num_heads=2, scaling="ntk_alpha", alpha=1000.0)
    assert enc.section == (16, 16, 16, 16)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [9, 10, 11, 40, 41, 300]])
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(2, 2, 6, 128, generator=g) for _ in range(2))
    want = rope.rotate(q, k, pos, pos)
    for p in (pos, pos.expand(4, -1, -1)):
        got = enc.rotate(q, k, p, p)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_transformers_recomposition_is_not_a_rotation_on_image_tokens():
    """transformers' apply_multimodal_rotary_pos_emb (modeling_hunyuan_vl.py @ 075b5a6) splits the
    full-width cos by the doubled sections: channel j of pair j < P/2 takes axis 0 (position), its
    partner j + P axis 2 (height). On an image token that map changes norms, so posenc (a rotation
    per pair, vLLM's) cannot and does not reproduce it; on text both are RoPE."""
    D, section = 16, (2, 2, 2, 2)
    enc = posenc.build("xdrope", d_model=2 * D, num_heads=2, xdrope_section=section)
    ids = xdrope_axes([1, (2, 2), 1])  # token 3: position 3, width 1, height 0, image 0
    full = torch.cat([enc.inv_freq.double()] * 2)  # (D,): emb = cat(freqs, freqs)
    chunks = [2 * s for s in section]  # the doubled sections over D channels, chunk i from axis i
    axis_of_channel = [i for i, n in enumerate(chunks) for _ in range(n)]
    x = torch.randn(D, generator=torch.Generator().manual_seed(3), dtype=F64)
    rot_half = torch.cat([-x[D // 2:], x[: D // 2]])
    for token, text in ((3, False), (0, True)):
        ang = torch.tensor([float(ids[axis_of_channel[c], token]) for c in range(D)], dtype=F64) * full
        hf = x * ang.cos() + rot_half * ang.sin()
        ours = enc.rotate(x[None, None, None].float(), x[None, None, None].float(),
                          ids[:, None, token:token + 1], ids[:, None, token:token + 1])[0].double().flatten()
        torch.testing.assert_close(ours.norm(), x.norm(), rtol=1e-6, atol=0)
        if text:
            torch.testing.assert_close(hf, ours, atol=1e-6, rtol=0)
        else:
            assert abs(hf.norm() - x.norm()) > 1e-3


def test_kv_cache_decoding_equals_the_full_forward():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=64, n_layer=2, n_head=2, n_kv_head=1, encoding="xdrope",
                      encoding_config={"xdrope_section": (4, 4, 4, 4), "scaling": "ntk_alpha", "alpha": 100.0})
    model = Transformer(cfg).to(F64).eval()
    full = xdrope_axes([2, (2, 3), 1 + 3])
    T = full.shape[1] - 3
    tokens = torch.randint(0, 64, (1, T + 3), generator=torch.Generator().manual_seed(0))
    seq = lambda a, z: SequenceInfo(torch.arange(a, z)[None], axes=full[:, None, a:z])  # noqa: E731
    with torch.no_grad():
        whole = model(tokens, seq(0, T + 3))
        cache = model.new_cache()
        steps = [model(tokens[:, :T], seq(0, T), cache=cache)]
        steps += [model(tokens[:, i : i + 1], seq(i, i + 1), cache=cache) for i in range(T, T + 3)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-10, rtol=1e-10)


# ---- configs -----------------------------------------------------------------------------------------
def test_default_sections():
    assert default_xdrope_section(64) == (16, 16, 16, 16)
    assert default_xdrope_section(6) == (2, 2, 1, 1)
    assert default_xdrope_section(6, num_axes=3) == (2, 2, 2)


def test_from_hf_reads_hunyuan_vl_configs():
    # HunyuanOCR's config.json: text at the top level, attention_head_dim 128 beside hidden 1024 / 16 heads
    legacy = {"model_type": "hunyuan_vl", "hidden_size": 1024, "num_attention_heads": 16, "attention_head_dim": 128,
              "rope_theta": 10000.0, "rope_scaling": {"type": "xdrope", "alpha": 1000.0, "factor": 1.0,
                                                      "xdrope_section": [16, 16, 16, 16]}}
    enc = from_hf(legacy)
    assert isinstance(enc, type(xdrope_from_hf(legacy))) and enc.section == (16, 16, 16, 16)
    assert enc.rotary_dim == 128 and enc.config.scaling == "ntk_alpha" and enc.config.alpha == 1000.0
    # transformers 5: text_config, rope_parameters {"rope_type": "dynamic", "mrope_section": [2.0, 2, 2, 2]}
    hf5 = {"model_type": "hunyuan_vl", "text_config": {
        "hidden_size": 64, "num_attention_heads": 4, "head_dim": 16,
        "rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "alpha": 50.0, "mrope_section": [2.0, 2, 2, 2]}}}
    enc = from_hf(hf5)
    assert enc.section == (2, 2, 2, 2) and enc.config.base == 1e4 and enc.config.alpha == 50.0
    with pytest.raises(ValueError, match="no xdrope_section"):
        from_hf({**legacy, "rope_scaling": {"type": "xdrope", "alpha": 1.0}})
    with pytest.raises(ValueError, match="rope_type must be 'xdrope'"):
        from_hf({**legacy, "rope_scaling": {"type": "yarn", "xdrope_section": [16] * 4}})


@pytest.mark.parametrize(
    "config, error, match",
    [
        ({"xdrope_section": (16, 16, 16, 8)}, ValueError, r"sum to the rotated pairs rotary_dim / 2 = 64, got"),
        ({"xdrope_section": (32, 32)}, ValueError, "must have 4 entries"),
        ({"xdrope_section": (16, 16, 16, -16, 32)}, ValueError, "must have 4 entries"),
        ({"xdrope_section": (16, 16, 16, -16)}, ValueError, "xdrope_section's image entry must be >= 0"),
        ({"xdrope_section": (16, 16, 16.0, 16)}, TypeError, r"xdrope_section\[2\] must be an int, got float"),
    ],
)
def test_config_refuses_bad_values_by_name(config, error, match):
    with pytest.raises(error, match=match):
        posenc.build("xdrope", d_model=1024, num_heads=8, **config)


def test_positions_with_the_wrong_number_of_axes_are_refused():
    enc = posenc.build("xdrope", d_model=64, num_heads=2)
    axes = xdrope_axes([3], num_axes=3)[:, None]
    with pytest.raises(ValueError, match=r"shape \(B, T\) or \(4, B, T\)"):
        enc.rotate(torch.randn(1, 2, 3, 32), torch.randn(1, 2, 3, 32), axes, axes)
    with pytest.raises(ValueError, match="xdrope reads 4 position axes"):
        enc.position_ids(SequenceInfo(torch.arange(3)[None], axes=axes))


@pytest.mark.parametrize(
    "blocks, kwargs, error, match",
    [
        ("3", {}, TypeError, "blocks must be a list"),
        ([], {}, ValueError, "at least one"),
        ([2, (1, 2, 3)], {}, ValueError, r"XD-RoPE image block must be an \(h, w\) tuple"),
        ([(0, 2)], {}, ValueError, "image block's h must be >= 1"),
        ([(2, 2.0)], {}, TypeError, "image block's w must be an int"),
        ([-1], {}, ValueError, "a text block must be >= 0"),
        ([2**25], {}, ValueError, "the tokens of blocks must be <= 16777216"),
        ([3], {"num_axes": 2}, ValueError, r"num_axes must be in \[3, 4\], got 2"),
        ([3], {"num_axes": 4.0}, TypeError, "num_axes must be an int"),
    ],
)
def test_bad_blocks_are_refused_by_name(blocks, kwargs, error, match):
    with pytest.raises(error, match=match):
        xdrope_axes(blocks, **kwargs)
