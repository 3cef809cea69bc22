"""VideoRoPE (Wei et al. 2025, arXiv 2502.05173) in posenc: ``video_rope_axes`` (diagonal layout,
adjustable temporal spacing) and ``mrope``'s ``video_rope=True`` (low-frequency temporal
allocation), each against a plain-Python re-derivation of the engine code that serves it:

* position ids: SGLang's ``BailingMRotaryEmbedding.bailing_3drope_get_input_positions_tensor``,
  python/sglang/srt/layers/rotary_embedding/bailing_mrope.py at commit
  31767460685a308b66712cb6ffe14dbfd27a5435 (the same function at a1efab20a5fcd9d5f7abc467ca9e920620f9686e);
* pair-to-axis rule: SGLang's ``_triton_ernie45_rope_qk_fused`` (python/sglang/kernels/ops/
  attention/rotary_triton.py at 0d7ff71496fe14d524400e7ffe802c97a6fc03f8), which
  ``BailingMRotaryEmbedding.forward`` calls on the section reordered to (h, w, t), and vLLM's
  ``BailingMRotaryEmbedding.select_cos_sin`` (vllm/model_executor/layers/rotary_embedding/
  bailing_mrope.py at 9c5b71639542eda95a0a3fa92e6802e4b4ecbdae);
* config keys: SGLang's ``get_rope`` (python/sglang/srt/layers/rotary_embedding/factory.py at
  108c36c008291c3a1ea524342837056c503c5724) builds it when ``rope_scaling`` holds
  ``mrope_section`` and ``video_rope: true``.
"""

from __future__ import annotations

import math

import pytest
import torch

import posenc
from posenc import SequenceInfo
from posenc.model import Transformer
from posenc.model_config import ModelConfig
from posenc.positions import video_rope_axes
from posenc.rotary.mrope import MROPE_LAYOUTS, default_mrope_section, mrope_from_hf, mrope_pair_axes
from tests.axes_reference import slow_axes_logits

F64 = torch.float64
# token ids as in SGLang's own test of this function (test_bailing_mrope.py's _position_config)
IMAGE_START, IMAGE_PATCH, VIDEO_PATCH, VIDEO_START, TEXT, TIMESTAMP = 10, 11, 12, 13, 7, 8


# ---- the engine's position ids, re-derived as a plain loop ------------------------------------------
def _engine_positions(tokens: list[int], image_grids, video_grids, merge: int, interleaved_frames: bool = False,
                      scale_factor: float = 2.0) -> list[list[int]]:
    """bailing_3drope_get_input_positions_tensor, step by step (SGLang bailing_mrope.py @ 3176746):
    grids are the processor's (t, h, w) before the merge; the engine fixes scale_factor = 2.0 and
    ignores second_per_grid_ts. Floats as there, cast to int at the end (``.to(input_ids.dtype)``)."""
    if image_grids is None and video_grids is None:
        return [list(range(len(tokens)))] * 3
    if video_grids is not None and interleaved_frames:  # use_interleaved_frame_timestamp: one grid a frame
        video_grids = [(1, h, w) for t, h, w in video_grids for _ in range(t)]

    def count(start_token: int, patch: int) -> int:  # start tokens followed by a patch
        return sum(1 for i in range(len(tokens) - 1) if tokens[i] == start_token and tokens[i + 1] == patch)

    n_images = count(IMAGE_START, IMAGE_PATCH) if image_grids is not None else 0
    n_videos = count(IMAGE_START if interleaved_frames else VIDEO_START, VIDEO_PATCH) if video_grids is not None else 0
    chunks: list[list[list[float]]] = []  # each (3 rows of ids)
    start = image_index = video_index = 0
    remaining_images, remaining_videos = n_images, n_videos
    for _ in range(n_images + n_videos):
        end_image = tokens.index(IMAGE_PATCH, start) if IMAGE_PATCH in tokens[start:] and remaining_images > 0 \
            else len(tokens) + 1
        end_video = tokens.index(VIDEO_PATCH, start) if VIDEO_PATCH in tokens[start:] and remaining_videos > 0 \
            else len(tokens) + 1
        if end_image < end_video:
            t, h, w = image_grids[image_index]
            image_index, remaining_images, media_start = image_index + 1, remaining_images - 1, end_image
        else:
            t, h, w = video_grids[video_index]
            video_index, remaining_videos, media_start = video_index + 1, remaining_videos - 1, end_video
        grid_h, grid_w = h // merge, w // merge
        text_len = media_start - start
        position_start = int(max(chunks[-1][0])) + 1 if chunks else 0  # the last chunk's time row
        chunks.append([[position_start + n for n in range(text_len)]] * 3)
        rows: list[list[float]] = [[], [], []]
        for i in range(t):
            for y in range(grid_h):
                for x in range(grid_w):
                    time = i * scale_factor + text_len + position_start
                    rows[0].append(time)
                    rows[1].append(y - (grid_h - 1) // 2 + time)
                    rows[2].append(x - (grid_w - 1) // 2 + time)
        chunks.append(rows)
        start = media_start + t * grid_h * grid_w
    if start < len(tokens):
        position_start = int(max(chunks[-1][0])) + 1 if chunks else 0
        chunks.append([[position_start + n for n in range(len(tokens) - start)]] * 3)
    return [[int(v) for c in chunks for v in c[a]] for a in range(3)]


def _prompt(items, merge: int, interleaved_frames: bool = False):
    """Tokens, image grids, video grids (before the merge) and posenc's blocks of one prompt;
    items: ("text", n), ("image", (t, h, w)) or ("video", (t, h, w)), grids after the merge; a
    medium is its start token, its patches and an end token (a text token)."""
    tokens, blocks, images, videos = [], [], [], []
    for kind, what in items:
        if kind == "text":
            tokens += [TEXT] * what
            blocks.append(what)
            continue
        t, h, w = what
        (images if kind == "image" else videos).append((t, h * merge, w * merge))
        frames = [(1, h, w)] * t if kind == "video" and interleaved_frames else [what]
        for grid in frames:
            if kind == "video" and interleaved_frames:
                tokens += [TIMESTAMP] * 2
                blocks.append(2)
            start = VIDEO_START if kind == "video" and not interleaved_frames else IMAGE_START
            tokens += [start] + [IMAGE_PATCH if kind == "image" else VIDEO_PATCH] * math.prod(grid) + [TEXT]
            blocks += [1, grid, 1]
    return tokens, images or None, videos or None, blocks


MIXES = {
    "text_image_video": [("text", 3), ("image", (1, 4, 6)), ("text", 2), ("video", (3, 4, 4)), ("text", 1)],
    "video_image_video": [("text", 1), ("video", (2, 3, 5)), ("image", (1, 2, 2)), ("video", (4, 1, 3)), ("text", 4)],
    "large_image_first": [("text", 1), ("image", (1, 9, 7)), ("text", 2)],  # ids below 0
    "ends_with_video": [("text", 2), ("video", (3, 2, 4))],
}


@pytest.mark.parametrize("merge", [1, 2])
@pytest.mark.parametrize("mix", sorted(MIXES))
def test_ids_equal_the_engine_on_text_image_video_mixes(mix, merge):
    tokens, images, videos, blocks = _prompt(MIXES[mix], merge)
    want = torch.tensor(_engine_positions(tokens, images, videos, merge))
    got = video_rope_axes(blocks)
    assert got.dtype == torch.long and got.shape == (3, len(tokens))
    assert torch.equal(got, want)
    if mix == "large_image_first":
        assert int(got.min()) < 0  # the engine's ids, negative ones included


def test_ids_equal_the_engine_with_interleaved_frame_timestamps():
    """use_interleaved_frame_timestamp: each frame its own grid after its timestamp tokens."""
    items = [("text", 2), ("video", (3, 2, 4)), ("image", (1, 3, 3)), ("text", 1)]
    tokens, images, videos, blocks = _prompt(items, 2, interleaved_frames=True)
    want = torch.tensor(_engine_positions(tokens, images, videos, 2, interleaved_frames=True))
    assert torch.equal(video_rope_axes(blocks), want)


@pytest.mark.parametrize("stride", [1, 3])
def test_other_temporal_strides_follow_the_engine_formula(stride):
    """delta = 2 is the engine's; others as its formula (and the authors' get_t_scale_rope_index) takes them."""
    tokens, images, videos, blocks = _prompt(MIXES["text_image_video"], 1)
    want = torch.tensor(_engine_positions(tokens, images, videos, 1, scale_factor=float(stride)))
    assert torch.equal(video_rope_axes(blocks, temporal_stride=stride), want)


def test_ids_by_hand():
    got = video_rope_axes([2, (1, 2, 3), 1])  # the docstring's example
    assert got.tolist() == [[0, 1, 2, 2, 2, 2, 2, 2, 3], [0, 1, 2, 2, 2, 3, 3, 3, 3], [0, 1, 1, 2, 3, 1, 2, 3, 3]]
    # two frames of 1 x 2, 2 apart in time; the text after them at the last frame's time + 1
    assert video_rope_axes([1, (2, 1, 2), 1]).tolist() == [[0, 1, 1, 3, 3, 4], [0, 1, 1, 3, 3, 4], [0, 1, 2, 3, 4, 4]]
    # text alone: every axis at 0..n-1, as the engine's no-media path
    assert torch.equal(video_rope_axes([3, 2]), torch.arange(5).expand(3, -1))


def test_decoding_continues_after_the_time_axis_not_after_the_largest_id():
    """The engine's position_delta continues at the time axis' largest id + 1; SequenceInfo.next
    (Qwen2-VL's rule) continues after the largest id of any axis: ids of a longer sequence come
    from the blocks with the trailing text extended."""
    prompt = video_rope_axes([1, (1, 8, 8), 1])  # image at time 1, its rows 1 - 3 .. 1 + 4; text at 2
    longer = video_rope_axes([1, (1, 8, 8), 3])
    assert torch.equal(longer[:, : prompt.shape[1]], prompt)
    assert longer[:, -2:].tolist() == [[3, 4]] * 3
    shifted = prompt - prompt.min()
    nxt = SequenceInfo(torch.arange(prompt.shape[1])[None], axes=shifted[:, None]).next(2)
    assert nxt.axes[:, 0].tolist() != (longer[:, -2:] - prompt.min()).tolist()


# ---- the pairs: the engine's allocation -------------------------------------------------------------
def _engine_pair_axes(section: tuple[int, int, int]) -> list[int]:
    """SGLang's Ernie 4.5 kernel on the section reordered (h, w, t): pair ridx < s_h + s_w takes
    height when ridx is even, width when odd; the rest time (0 time, 1 height, 2 width)."""
    t, h, w = section
    section_hw = h + w
    out = []
    for ridx in range(t + h + w):
        if ridx < section_hw:
            out.append(1 if ridx & 1 == 0 else 2)
        else:
            out.append(0)
    return out


@pytest.mark.parametrize("section", [(16, 24, 24), (8, 12, 12), (2, 2, 2), (0, 3, 3), (6, 0, 0)])
def test_pair_axes_are_the_engines(section):
    got = mrope_pair_axes(section, False, video_rope=True)
    assert got.tolist() == _engine_pair_axes(section)
    enc = posenc.build("mrope", d_model=4 * sum(section), num_heads=2, mrope_section=section, video_rope=True)
    assert enc.section == section and enc.config.mrope_layout == "video_rope"
    # time takes the last s_t pairs: the lowest frequencies, base^(-2j/r) falling with j
    assert got[sum(section) - section[0]:].eq(0).all()


def test_cos_sin_pick_each_pairs_axis_as_vllm_select_cos_sin():
    """vLLM's test of select_cos_sin (mrope_section [2, 2, 2], rotary_dim 12): positions t=1,
    h=3, w=5 give pairs (h, w, h, w, t, t)."""
    enc = posenc.build("mrope", d_model=24, num_heads=2, mrope_section=(2, 2, 2), video_rope=True)
    axes = torch.tensor([1, 3, 5])[:, None, None]  # (3, B=1, T=1)
    cos, sin = enc.cos_sin(axes)
    pos = torch.tensor([3, 5, 3, 5, 1, 1], dtype=F64)
    ang = pos * enc.inv_freq
    torch.testing.assert_close(cos[0, 0].double(), ang.cos(), atol=1e-7, rtol=0)
    torch.testing.assert_close(sin[0, 0].double(), ang.sin(), atol=1e-7, rtol=0)


# ---- the rotation: a slow loop at the engine's (negative) ids --------------------------------------
def _slow_logits(q, k, ids: list[list[int]], section, base: float):
    """q·k after the slow per-pair rotation (tests/axes_reference.py), the axis from the engine's rule."""
    return slow_axes_logits(q, k, ids, _engine_pair_axes(section), base)


def test_logits_equal_the_slow_loop_at_the_engines_ids_shifted_to_be_non_negative():
    section = (2, 3, 3)
    tokens, images, videos, blocks = _prompt(MIXES["large_image_first"][:2] + [("video", (2, 2, 3)), ("text", 1)], 1)
    ids = _engine_positions(tokens, images, videos, 1)
    assert min(map(min, ids)) < 0
    enc = posenc.build("mrope", d_model=32, num_heads=2, base=1e4, mrope_section=section, video_rope=True)
    axes = video_rope_axes(blocks)
    axes = (axes - axes.min())[:, None]  # SequenceInfo's ids are >= 0: one shift of every axis
    SequenceInfo(torch.arange(axes.shape[-1])[None], axes=axes)  # accepted
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, axes.shape[-1], 16, generator=g, dtype=F64) for _ in range(2))
    got = torch.einsum("bhid,bhjd->bhij", *enc.rotate(q, k, axes, axes))
    # posenc's cos/sin tables are float32 (float64 angles): 1e-5 on logits of ~16 terms
    torch.testing.assert_close(got, _slow_logits(q, k, ids, section, 1e4), atol=1e-5, rtol=0)


def test_logits_depend_on_the_three_differences_only():
    enc = posenc.build("mrope", d_model=64, num_heads=2, mrope_section=(4, 6, 6), video_rope=True)
    axes = video_rope_axes([3, (2, 3, 3), 2])
    axes = (axes - axes.min())[:, None]
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 2, axes.shape[-1], 32, generator=g, dtype=F64) for _ in range(2))
    logits = lambda a: torch.einsum("bhid,bhjd->bhij", *enc.rotate(q, k, a, a))  # noqa: E731
    shift = torch.tensor([7, 100, 31])[:, None, None]
    torch.testing.assert_close(logits(axes + shift), logits(axes), atol=1e-5, rtol=1e-5)
    for a in range(3):  # moving one axis of some tokens changes them
        moved = axes.clone()
        moved[a, :, 4:] += 3
        assert (logits(moved) - logits(axes)).abs().max() > 1e-2


def test_text_only_equals_plain_rope_exactly():
    enc = posenc.build("mrope", d_model=256, num_heads=2, base=1e6, video_rope=True)
    rope = posenc.build("rope", d_model=256, num_heads=2, base=1e6)
    assert enc.section == (16, 24, 24)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [9, 10, 11, 40, 41, 300]])
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(2, 2, 6, 128, generator=g) for _ in range(2))
    want = rope.rotate(q, k, pos, pos)
    for p in (pos, pos.expand(3, -1, -1)):
        got = enc.rotate(q, k, p, p)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    text = torch.stack([video_rope_axes([6]), video_rope_axes([3, 2, 1]) + 9], dim=1)  # (3, 2, 6): text blocks
    got, want = enc.rotate(q, k, text, text), rope.rotate(q, k, text[0], text[0])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_kv_cache_decoding_with_the_engines_ids_equals_the_full_forward():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=48, n_layer=2, n_head=2, n_kv_head=1, encoding="mrope",
                      encoding_config={"mrope_section": (4, 4, 4), "video_rope": True})
    model = Transformer(cfg).to(F64).eval()
    full = video_rope_axes([2, (2, 3, 3), 1 + 3])
    full = full - full.min()
    T = full.shape[1] - 3
    tokens = torch.randint(0, 64, (1, T + 3), generator=torch.Generator().manual_seed(0))
    seq = lambda a, z: SequenceInfo(torch.arange(a, z)[None], axes=full[:, None, a:z])  # noqa: E731
    with torch.no_grad():
        whole = model(tokens, seq(0, T + 3))
        cache = model.new_cache()
        steps = [model(tokens[:, :T], seq(0, T), cache=cache)]
        steps += [model(tokens[:, i : i + 1], seq(i, i + 1), cache=cache) for i in range(T, T + 3)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-10, rtol=1e-10)


# ---- configs ----------------------------------------------------------------------------------------
def test_default_sections():
    assert default_mrope_section(64, False, True) == (16, 24, 24)  # the paper's on Qwen2-VL's head
    assert default_mrope_section(32, False, True) == (8, 12, 12)  # Ming's (SGLang's BailingMM2Config default)
    assert default_mrope_section(2, False, True) == (2, 0, 0)
    assert MROPE_LAYOUTS == ("chunked", "interleaved", "video_rope")
    assert "video_rope" in repr(posenc.build("mrope", d_model=64, num_heads=2, video_rope=True))


def test_from_hf_reads_bailing_configs():
    # SGLang's BailingMM2Config: the text model in llm_config, rope parameters set to
    # {rope_type: default, mrope_section, video_rope: True}, partial_rotary_factor 0.5
    llm = {"hidden_size": 2048, "num_attention_heads": 16, "partial_rotary_factor": 0.5, "rope_theta": 6e5,
           "rope_parameters": {"rope_type": "default", "mrope_section": [8, 12, 12], "video_rope": True}}
    enc = mrope_from_hf({"model_type": "bailingmm_moe_v2_lite", "llm_config": llm})
    assert enc.config.mrope_layout == "video_rope" and enc.section == (8, 12, 12)
    assert enc.rotary_dim == 64 and enc.config.base == 6e5
    # a Ming config.json: rope_scaling {"type": "video_rope", "factor": null}, the section outside
    ming = {"mrope_section": [8, 12, 12], "llm_config": {**llm, "rope_parameters": None,
                                                         "rope_scaling": {"type": "video_rope", "factor": None}}}
    assert mrope_from_hf(ming).config.mrope_layout == "video_rope"
    # without the key, the Qwen readings are unchanged
    qwen = {"model_type": "qwen2_vl", "hidden_size": 1536, "num_attention_heads": 12,
            "rope_parameters": {"rope_type": "default", "mrope_section": [16, 24, 24]}}
    assert mrope_from_hf(qwen).config.mrope_layout == "chunked"


@pytest.mark.parametrize(
    "config, error, match",
    [
        ({"video_rope": True, "mrope_interleaved": True}, ValueError, "set at most one, got both True"),
        ({"video_rope": True, "mrope_section": (16, 20, 28)}, ValueError,
         r"height and width entries must be equal with video_rope=True .*got \[16, 20, 28\]"),
        ({"video_rope": True, "mrope_section": (20, 24, 24)}, ValueError,
         "sum to the rotated pairs rotary_dim / 2 = 64"),
        ({"video_rope": 1}, TypeError, "video_rope must be a bool"),
    ],
)
def test_config_refuses_bad_values_by_name(config, error, match):
    with pytest.raises(error, match=match):
        posenc.build("mrope", d_model=1536, num_heads=12, **config)


@pytest.mark.parametrize(
    "blocks, kwargs, error, match",
    [
        ("3", {}, TypeError, "blocks must be a list"),
        ([], {}, ValueError, "at least one"),
        ([2, (2, 1, 1, 12.5)], {}, ValueError, r"VideoRoPE vision block must be a \(t, h, w\) tuple"),
        ([2, (1, 2)], {}, ValueError, r"VideoRoPE vision block must be a \(t, h, w\) tuple"),
        ([(1, 0, 2)], {}, ValueError, "vision block's h must be >= 1"),
        ([(1, 2, 2.0)], {}, TypeError, "vision block's w must be an int"),
        ([-1], {}, ValueError, "a text block must be >= 0"),
        ([2**25], {}, ValueError, "the tokens of blocks must be <= 16777216"),
        ([3], {"temporal_stride": 0}, ValueError, r"temporal_stride must be in \[1, 16777216\], got 0"),
        ([3], {"temporal_stride": 2**30}, ValueError, r"temporal_stride must be in \[1, 16777216\]"),
        ([3], {"temporal_stride": 2.0}, TypeError, "temporal_stride must be an int"),
        ([3], {"temporal_stride": True}, TypeError, "temporal_stride must be an int"),
    ],
)
def test_bad_blocks_and_strides_are_refused_by_name(blocks, kwargs, error, match):
    with pytest.raises(error, match=match):
        video_rope_axes(blocks, **kwargs)
