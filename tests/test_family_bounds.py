"""Bounds of the absolute and relative families' configs, and the numerics they protect.

* every size-like int field has a maximum: accepted at it, refused one past it with a
  message naming the field, the range and the value; tables are also bounded in numbers
  (rows x width) when the module is built, before anything is allocated;
* every float field has a range that keeps the forward finite in float32: a tiny model's
  logits are finite at each end of the range, and a value past it is refused by name;
* the fields come from the registry (every int and float field of every encoding of the
  two families) and each bound is read from the field's own error, so a new encoding is
  checked with nothing added here;
* T = 0 gives empty logits for every registered encoding; models built inside
  ``inference_mode`` decode (the old caches keyed on ``_version`` crashed there);
* complex_order in bfloat16 keeps float32 frequencies; DeBERTa's LayerNorm takes
  ``layer_norm_eps`` and then matches ``transformers.DebertaV2Model``.
"""

from __future__ import annotations

import math
import re
import typing

import pytest
import torch
from torch import nn

from helpers import all_encodings, tiny_model
from posenc import SequenceInfo, build
from posenc.config import field_types
from posenc.registry import get_info, list_encodings

FAMILIES = ("absolute", "relative")
MINE = [n for n in list_encodings() if get_info(n).family in FAMILIES]


def _fields(kind: type) -> set[tuple[str, str]]:
    """(encoding, field) of every field of ``kind`` (alone or in a union) in the families."""
    out = set()
    for name in MINE:
        for field, tp in field_types(get_info(name).config_cls).items():
            if tp is kind or kind in typing.get_args(tp):
                out.add((name, field))
    return out


# ---- sizes -------------------------------------------------------------------------------
INT_FIELDS = sorted(_fields(int))  # (encoding, field), from the registry
_RANGE = r"must be in \[(-?\d+), (\d+)\], got "


def _int_maximum(name: str, field: str) -> int:
    """The maximum the config states when refusing 10**15: ``field must be in [lo, hi], got ...``."""
    with pytest.raises(ValueError, match=rf"^{field} {_RANGE}1000000000000000$") as e:
        get_info(name).config_cls(**{field: 10**15})
    return int(re.search(_RANGE, str(e.value)).group(2))


# Fields whose maximum is valid only together with other fields: (encoding, field) -> those fields.
NEEDS = {
    ("sinusoidal", "dim"): {"fusion": "concat"},
    ("floater", "steps_per_position"): {"max_position": 16},
    ("deberta", "max_relative_positions"): {"position_buckets": 0},
    ("deberta", "position_buckets"): {"max_relative_positions": 2**23},
    ("t5", "num_buckets"): {"max_distance": 2**40},
}


def test_the_size_fields_are_found():
    assert len(INT_FIELDS) > 10 and ("learned", "max_len") in INT_FIELDS
    assert set(NEEDS) <= set(INT_FIELDS)


@pytest.mark.parametrize("name,field", INT_FIELDS, ids=lambda v: v)
def test_size_bound_accepted_at_maximum_refused_past_it(name, field):
    """Every int field of the two families has a maximum, read from its own error: accepted at
    it (with the fields in NEEDS), refused one past it and at 10**12 with the same message."""
    cls, extra = get_info(name).config_cls, NEEDS.get((name, field), {})
    maximum = _int_maximum(name, field)
    assert getattr(cls(**extra, **{field: maximum}), field) == maximum  # the config only: no table built
    with pytest.raises(ValueError, match=rf"^{field} must be in \[-?\d+, {maximum}\], got {maximum + 1}$"):
        cls(**extra, **{field: maximum + 1})
    huge = max(10**12, 1000 * maximum)  # the issue's 10**12: refused, not an allocator error
    with pytest.raises(ValueError, match=rf"^{field} must be in \[-?\d+, {maximum}\], got {huge}$"):
        cls(**extra, **{field: huge})


# Maxima that are part of the design (a change to one is a decision, not drift).
INT_MAXIMA = {("learned", "max_len"): 2**24, ("shaw", "clip"): 2**23 - 1, ("transformer_xl", "clip"): 2**40,
              ("t5", "max_distance"): 2**40, ("floater", "max_position"): 2**20, ("fire", "mlp_width"): 4096}


def test_design_maxima():
    assert {k: _int_maximum(*k) for k in INT_MAXIMA} == INT_MAXIMA


def test_floater_steps_bound_the_whole_integration():
    # 2^20 RK4 steps in all: max_position shrinks with steps_per_position
    with pytest.raises(ValueError, match=r"^max_position must be in \[1, 16384\], got 16385$"):
        get_info("floater").config_cls(steps_per_position=64, max_position=2**14 + 1)
    assert get_info("floater").config_cls(steps_per_position=64, max_position=2**14).max_position == 2**14


# (encoding, field, value within the field's own bound, other fields, message); d_model 512,
# 4 heads (head_dim 128). Each would be a table of 2^31 numbers or more (8 GiB in float32).
TABLE_SIZES = [
    ("learned", "max_len", 2**22 + 1, {}, r"max_len must be <= 2097152 with d_model=512 .*got 4194305"),
    ("multiplicative", "max_len", 2**24, {}, r"max_len must be <= 2097152 with d_model=512 .*got 16777216"),
    ("deberta", "max_relative_positions", 2**23, {"position_buckets": 0},
     r"max_relative_positions must be <= 1048576 with d_model=512 .*got 8388608"),
    ("shaw", "clip", 2**22, {}, r"clip must be <= 4194303 with head_dim=128 .*got 4194304"),
    ("relative_key", "clip", 2**22, {}, r"clip must be <= 4194303 with head_dim=128 .*got 4194304"),
]


@pytest.mark.parametrize("name,field,value,extra,match", TABLE_SIZES, ids=lambda v: v if isinstance(v, str) else None)
def test_table_size_refused_at_build_before_allocating(name, field, value, extra, match):
    with pytest.raises(ValueError, match=match):
        build(name, d_model=512, num_heads=4, **extra, **{field: value})


def test_t5_table_size_counts_the_heads():
    with pytest.raises(ValueError, match=r"num_buckets must be <= 8388608 with num_heads=128 .*got 16777216"):
        build("t5", d_model=512, num_heads=128, num_buckets=2**24, max_distance=2**40)


def test_table_size_message_gives_the_largest_value_that_fits():
    """The largest value named is exact: its table has at most 2^30 numbers, one more does not
    fit (checked by arithmetic: building a 4 GiB table is no test for a shared machine)."""
    from posenc.limits import MAX_TABLE_ELEMENTS, check_table_size

    for width, rows_per, extra in [(128, 2, 1), (1024, 1, 0), (96, 2, 0), (7, 2, 1)]:
        with pytest.raises(ValueError, match=r"must be <= (\d+) ") as e:
            check_table_size("k", 2**30, width, "w", rows_per=rows_per, extra_rows=extra)
        largest = int(re.search(r"<= (\d+) ", str(e.value)).group(1))
        assert (rows_per * largest + extra) * width <= MAX_TABLE_ELEMENTS
        assert (rows_per * (largest + 1) + extra) * width > MAX_TABLE_ELEMENTS
        check_table_size("k", largest, width, "w", rows_per=rows_per, extra_rows=extra)  # no error


# ---- floats ------------------------------------------------------------------------------
FLOAT_FIELDS = sorted(_fields(float))  # (encoding, field), from the registry
_INTERVAL = r"must be in ([\[(])(\S+), (\S+?)([\])]), got "


def _float_range(name: str, field: str) -> tuple[str, float, float, str]:
    """The interval a float field states when refusing a value far outside it (+-1e300)."""
    cls = get_info(name).config_cls
    for probe in (1e300, -1e300):
        try:
            cls(**{field: probe})
        except ValueError as e:
            m = re.search(rf"^{field} {_INTERVAL}", str(e))
            assert m, str(e)
            return m.group(1), float(m.group(2)), float(m.group(3)), m.group(4)
    raise AssertionError(f"{name}.{field} accepts both 1e300 and -1e300: no finite range")


def _inside_ends(lo_b: str, lo: float, hi: float, hi_b: str) -> list[float]:
    """The two ends of the interval, or the nearest values inside it when an end is open."""
    low = lo if lo_b == "[" else (1e-30 if lo == 0 else lo + abs(lo) * 1e-6)
    high = 1e300 if math.isinf(hi) else (hi if hi_b == "]" else hi - abs(hi) * 1e-6)
    return [low, high]


def _outside_ends(lo_b: str, lo: float, hi: float, hi_b: str) -> list[float]:
    """Values just past each finite end."""
    out = [lo if lo_b == "(" else (lo - max(abs(lo) * 1e-3, 1e-9))]
    if not math.isinf(hi):
        out.append(hi if hi_b == ")" else hi + abs(hi) * 1e-3)
    return out


def test_the_float_fields_are_found():
    assert len(FLOAT_FIELDS) > 10 and ("fire", "init_c") in FLOAT_FIELDS


# (encoding, field, other fields, values at the ends of the range, values past them): ranges
# that depend on other fields, and values that once made non-finite logits.
FLOAT_BOUNDS = [
    ("deberta", "init_std", {"layer_norm": False}, [1e4, 1e-30], [1.0001e4, 1e30, 0.0]),
    ("kerple", "r2_init", {"variant": "power"}, [2.0, 0.01], [2.01, 0.009]),
    ("fire", "init_c", {}, [1e6, 1e-6], [1.01e6, 1e308, 0.99e-6]),
    ("complex_order", "base", {}, [1.0, 1e300], [0.999, 1e-300]),
]


def _logits(name: str, config: dict) -> torch.Tensor:
    model = tiny_model(name, encoding_config=config)
    # Far positions stress the frequencies and distances; floater pays for each (RK4 from 0).
    offset = 100 if name == "floater" else 1000
    tokens = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(tokens, SequenceInfo.from_offset(2, 6, offset))


@pytest.mark.parametrize("name,field", FLOAT_FIELDS, ids=lambda v: v)
def test_every_float_range_keeps_logits_finite_and_is_enforced(name, field):
    """Every float field of the two families states a finite range (or [a, inf) for a base);
    a tiny model's logits are finite at both ends of it and a value just past an end is refused."""
    lo_b, lo, hi, hi_b = _float_range(name, field)
    assert math.isfinite(lo)
    for value in _inside_ends(lo_b, lo, hi, hi_b):
        logits = _logits(name, {field: value})
        assert logits.shape == (2, 6, 64) and logits.isfinite().all(), (field, value)
    for value in _outside_ends(lo_b, lo, hi, hi_b):
        with pytest.raises(ValueError, match=rf"^{field} must be in .*, got {re.escape(str(value))}$"):
            get_info(name).config_cls(**{field: value})


@pytest.mark.parametrize("name,field,extra,ok,bad", FLOAT_BOUNDS, ids=lambda v: v if isinstance(v, str) else None)
def test_float_range_keeps_logits_finite_and_is_enforced(name, field, extra, ok, bad):
    for value in ok:
        logits = _logits(name, {**extra, field: value})
        assert logits.shape == (2, 6, 64) and logits.isfinite().all(), (field, value)
    for value in bad:
        with pytest.raises(ValueError, match=rf"^{field} must be in .*, got {re.escape(str(value))}$"):
            get_info(name).config_cls(**extra, **{field: value})


def test_issue_configs_that_made_non_finite_logits_are_refused():
    for name, cfg in [("floater", {"delta": 1e30}), ("fire", {"init_c": 1e308}),
                      ("learned", {"init_std": 1e30}), ("complex_order", {"base": 1e-300})]:
        with pytest.raises(ValueError, match=rf"^{next(iter(cfg))} must be in"):
            get_info(name).config_cls(**cfg)


# ---- empty sequences, inference mode ---------------------------------------------------
ALL = all_encodings()


def test_registry_lists_all_families():
    assert len(ALL) >= 19 and set(MINE) <= set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_empty_sequence_gives_empty_logits(name):
    model = tiny_model(name)
    out = model(torch.zeros(3, 0, dtype=torch.long))
    assert out.shape == (3, 0, 64)
    out.sum().backward()  # and a backward through it (training on an empty batch)
    with torch.inference_mode():
        assert model(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0, 64)


@pytest.mark.parametrize("name,over", [("deberta", {}), ("deberta", {"share_att_key": True}), ("floater", {})])
def test_built_in_inference_mode_decodes_like_the_full_forward(name, over):
    """The old DeBERTa and FLOATER memos read ``p._version``, which inference tensors lack."""
    over = {"encoding_config": over}
    ref = tiny_model(name, **over)
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    want = ref(tokens).detach()
    with torch.inference_mode():
        model = tiny_model(name, **over)  # parameters are inference tensors
        assert all(p.is_inference() for p in model.parameters())
        cache = model.new_cache()
        got = torch.cat([model(tokens[:, :4], cache=cache)] + [model(tokens[:, t : t + 1], cache=cache) for t in range(4, 9)], 1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ---- precision -----------------------------------------------------------------------------
def test_complex_order_bf16_model_keeps_float32_frequencies():
    """The old code rounded the learned omega to bfloat16: at position ~8192 the logits of a
    bf16 model moved by ~0.6 from the float32 model's. Now only the activations are bf16."""
    f32 = tiny_model("complex_order")
    with torch.no_grad():
        f32.encodings[0].theta.normal_()  # non-zero phases, also angle-like
    bf16 = tiny_model("complex_order")
    bf16.load_state_dict(f32.state_dict())
    bf16 = bf16.to(torch.bfloat16)
    enc = bf16.encodings[0]
    assert enc.omega.dtype == enc.theta.dtype == torch.float32
    assert enc.omega.equal(f32.encodings[0].omega) and enc.theta.equal(f32.encodings[0].theta)
    assert bf16.tok_emb.weight.dtype == torch.bfloat16
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    seq = SequenceInfo.from_offset(2, 8, 8184)
    with torch.no_grad():
        want = f32(tokens, seq)
        got = bf16(tokens, seq).float()
        tol = dict(atol=0.05, rtol=0.05)  # bf16 activations: 2^-8 relative per op, a few layers
        torch.testing.assert_close(got, want, **tol)
        enc.omega.data = enc.omega.data.bfloat16().float()  # what the old cast did
        old = bf16(tokens, seq).float()
    assert not torch.allclose(old, want, **tol), (old - want).abs().max()


def test_float32_params_survive_casts_and_moves():
    for name, params in [("complex_order", ("omega", "theta")), ("floater", ("w1", "b1", "w2", "b2", "p0")),
                         ("fire", ("c", "L_multiplier"))]:
        enc = build(name, d_model=8, num_heads=2)
        before = {p: getattr(enc, p).detach().clone() for p in params}
        enc.half()
        for p in params:
            assert getattr(enc, p).dtype == torch.float32 and getattr(enc, p).equal(before[p]), (name, p)
        enc.double()  # a wider cast applies as usual
        assert all(getattr(enc, p).dtype == torch.float64 for p in params)
        assert isinstance(getattr(enc, params[0]), nn.Parameter)


@pytest.mark.parametrize("share", [False, True])
def test_deberta_layer_norm_eps_matches_hf_deberta_v2_model(share):
    """The position term with norm_rel_ebd="layer_norm" against ``DebertaV2Model`` with the
    same weights: HF normalizes the table with ``layer_norm_eps`` (1e-7); the old fixed 1e-5
    moved the term by ~1 % at init_std 0.02 (variance 4e-4)."""
    from transformers import DebertaV2Config, DebertaV2Model

    C, H, T = 16, 2, 9
    cfg = DebertaV2Config(
        vocab_size=32, hidden_size=C, num_hidden_layers=1, num_attention_heads=H, intermediate_size=32,
        relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=4, max_relative_positions=8,
        share_att_key=share, norm_rel_ebd="layer_norm",
    )
    torch.manual_seed(0)
    hf = DebertaV2Model(cfg).double().eval()
    with torch.no_grad():  # a non-trivial LayerNorm
        hf.encoder.LayerNorm.weight.normal_(1.0, 0.1)
        hf.encoder.LayerNorm.bias.normal_(0.0, 0.1)
    att = hf.encoder.layer[0].attention.self
    x = torch.randn(2, T, C, dtype=torch.float64)
    qh = att.transpose_for_scores(att.query_proj(x), H)  # (B*H, T, D)
    kh = att.transpose_for_scores(att.key_proj(x), H)
    with torch.no_grad():
        want = att.disentangled_attention_bias(qh, kh, None, hf.encoder.get_rel_embedding(), 3).view(2, H, T, T)
    from posenc.encoding import QKProjection

    proj = QKProjection(att.query_proj, att.key_proj, H, H, C // H)
    pos = torch.arange(T).expand(2, T)

    def ours(**cfg):
        enc = build("deberta", d_model=C, num_heads=H, position_buckets=4, max_relative_positions=8,
                    share_att_key=share, **cfg).double()
        with torch.no_grad():
            enc.rel_embeddings.copy_(hf.encoder.rel_embeddings.weight)
            enc.norm.load_state_dict(hf.encoder.LayerNorm.state_dict())
            if not share:
                enc.pos_key_proj.load_state_dict(att.pos_key_proj.state_dict())
                enc.pos_query_proj.load_state_dict(att.pos_query_proj.state_dict())
            return enc.score(qh.view(2, H, T, -1), kh.view(2, H, T, -1), pos, pos, proj=proj)

    assert hf.encoder.LayerNorm.eps == 1e-7
    # HF divides by sqrt(D * 3) computed in float32, hence 1e-7 rather than 1e-10.
    torch.testing.assert_close(ours(), want, atol=1e-7, rtol=1e-7)
    old = ours(layer_norm_eps=1e-5)
    assert (old - want).abs().max() > 1e-3 * want.abs().max()


# ---- non-finite values and position layouts: the whole registry ---------------------------
@pytest.mark.parametrize("name", ALL)
def test_non_finite_config_values_are_refused_by_name(name):
    """Every config key of every encoding (RoPE's scaling keys included): NaN and +-inf are a
    ValueError or TypeError naming the key, never accepted and never an OverflowError later."""
    keys = get_info(name).config_keys
    for key in keys:
        for value in (float("nan"), float("inf"), float("-inf")):
            with pytest.raises((ValueError, TypeError), match=rf"\b{key}\b"):
                build(name, d_model=16, num_heads=2, **{key: value})


@pytest.mark.parametrize("name", ALL)
def test_non_finite_parameters_propagate_or_are_named(name):
    """A parameter or buffer of the encoding set to NaN or inf (a diverged update, a bad
    checkpoint): the forward either runs (the non-finite values propagate into the logits) or
    raises a ValueError naming that parameter; never an OverflowError, an IndexError or an
    int conversion error (FIRE's int(ceil(L)) and CoPE's NaN.long() index did)."""
    model = tiny_model(name)
    tokens = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    seq = SequenceInfo.from_offset(2, 6, 3)
    tensors = [(n, t) for n, t in [*model.encodings.named_parameters(), *model.encodings.named_buffers()]
               if t.is_floating_point()]
    for pname, t in tensors:
        keep = t.detach().clone()
        for value in (float("nan"), float("inf")):
            with torch.no_grad():
                t.fill_(value)
                try:
                    model(tokens, seq)
                except ValueError as e:
                    assert pname.split(".")[-1] in str(e), (pname, value, str(e))
                t.copy_(keep)


_BASE = torch.stack([torch.arange(7) + 3, torch.arange(7) * 2])  # two different rows: no shared-row shortcut
LAYOUTS = {
    "transposed": _BASE.t().contiguous().t(),  # strides (1, 2)
    "strided": torch.stack([_BASE, _BASE], -1)[..., 0],  # every other element of a buffer
    "expanded": (torch.arange(7) + 3).expand(2, 7),  # stride 0 along the batch
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", ALL)
def test_positions_in_any_memory_layout_give_the_same_logits(name, layout):
    """Positions as a non-contiguous tensor (a transpose, a slice, an expand) give the logits
    and parameter gradients of the same positions stored contiguously (FIRE's per-pair path
    called .view on them)."""
    positions = LAYOUTS[layout]
    assert not positions.is_contiguous()
    tokens = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    runs = []
    for pos in (positions.contiguous(), positions):
        model = tiny_model(name)
        out = model(tokens, SequenceInfo(pos))
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        grads = torch.autograd.grad((out * w).sum(), list(model.parameters()), allow_unused=True)
        runs.append((out.detach(), grads))
    (want, want_g), (got, got_g) = runs
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(got_g, want_g):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
