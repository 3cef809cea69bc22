"""torch.compile: a tiny model per hook kind compiles with fullgraph=True and dynamic lengths,
gives the eager result, and never mutates a buffer or a Python-side cache in forward (caches
are built outside forward); every multi-axis encoding's whole model and every training-free
method's positions, compiled with inductor, equal eager."""

from __future__ import annotations

import pytest
import torch

import posenc
from helpers import tiny_model
from posenc.methods import METHODS, build_method

pytestmark = pytest.mark.compile


def _representatives() -> list[str]:
    """The first registered encoding of each hook kind (embed, rotate, bias, terms)."""
    picks: dict[str, str] = {}
    for name in posenc.list_encodings():
        enc = posenc.build(name, d_model=32, num_heads=4)
        for kind in ("embed", "rotate", "bias", "terms"):
            if getattr(enc, f"has_{kind}") and kind not in picks:
                picks[kind] = name
    return list(dict.fromkeys(picks.values()))


def _python_state(model: torch.nn.Module) -> dict:
    """Every dict attribute of every submodule (where caches live), shallowly: keys -> value ids."""
    return {
        (mod_name, attr): {k: id(v) for k, v in value.items()}
        for mod_name, mod in model.named_modules()
        for attr, value in vars(mod).items()
        if isinstance(value, dict) and attr not in ("_modules", "_parameters", "_buffers")
    }


@pytest.mark.parametrize("name", _representatives())
def test_compiles_fullgraph_dynamic_without_buffer_mutation(name):
    torch._dynamo.reset()
    model = tiny_model(name)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    inputs = [torch.randint(0, 64, (2, T)) for T in (9, 17, 33)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]  # eager first: eager caches may fill here, not below
        buffers = {n: (b, b._version, b.data_ptr()) for n, b in model.named_buffers()}
        state = _python_state(model)
        for x, want in zip(inputs, expected):
            torch.testing.assert_close(compiled(x), want, atol=1e-5, rtol=1e-5)
    # Names first (a buffer added or removed fails even when the model had none), then each one.
    assert [n for n, _ in model.named_buffers()] == list(buffers), "forward added or removed a buffer"
    for n, b in model.named_buffers():
        old, version, ptr = buffers[n]
        assert b is old and b._version == version and b.data_ptr() == ptr, f"buffer {n} was mutated in forward"
    assert _python_state(model) == state, "a compiled forward changed a Python-side cache"


def test_representatives_cover_every_hook_kind():
    names = _representatives()
    kinds = {k for n in names for k in ("embed", "rotate", "bias", "terms")
             if getattr(posenc.build(n, d_model=32, num_heads=4), f"has_{k}")}
    assert kinds == {"embed", "rotate", "bias", "terms"}, names


def test_alibi_keeps_its_slope_buffer_through_compile():
    """A model with a buffer (ALiBi's float32 slopes), so the buffer checks above have one to check."""
    assert [n for n, _ in tiny_model("alibi").named_buffers()] == ["encodings.0.slope_table"]


def _multi_axis() -> list[tuple[str, int]]:
    """(name, A) of every registered encoding that reads A >= 2 position axes: its
    ``position_ids`` returns ``seq.axes`` (and refuses another count of axes)."""
    found = []
    for name in posenc.list_encodings():
        enc = posenc.build(name, d_model=32, num_heads=4)
        for axes in (2, 3, 4):
            seq = posenc.SequenceInfo.from_offset(1, 4).with_axes(torch.zeros(axes, 1, 4, dtype=torch.long))
            try:
                if enc.position_ids(seq) is seq.axes:
                    found.append((name, axes))
            except ValueError:  # reads another number of axes
                pass
    return found


MULTI_AXIS = _multi_axis()
T_AXES = 20  # past the default grid width (16) and not a multiple of it: a partial last grid row


def _axes_seq(axes: int) -> posenc.SequenceInfo:
    """T_AXES tokens on ``axes`` axes, built where it is called (inside the compiled function)."""
    if axes == 2:
        return posenc.SequenceInfo.from_grid(4, 5, batch=2)  # (row, column) of a 4 x 5 grid
    from posenc.positions import multimodal_axes, xdrope_axes

    if axes == 4:  # XD-RoPE's position / width / height / image: text, a 2 x 3 image with its
        ids = xdrope_axes([3, (2, 3), 7])  # begin, row-end and end tokens, text: 20 tokens
    else:
        ids = multimodal_axes([3, (2, 2, 3), 5])  # text, a 2-frame 2 x 3 video, text: 20 tokens
    return posenc.SequenceInfo.from_offset(2, T_AXES).with_axes(ids[:, None].expand(-1, 2, -1))


def test_multi_axis_encodings_are_found():
    names = {n for n, _ in MULTI_AXIS}
    assert {"mrope", "xdrope", "rope_axial", "rope_mixed"} <= names, MULTI_AXIS


@pytest.mark.parametrize("name,axes", MULTI_AXIS)
def test_multi_axis_compiled_model_equals_eager(name, axes):
    """The whole model under inductor, its positions made inside the graph: plain (B, T)
    positions (raster patches for 2-D RoPE, T past the grid width and not a multiple of it) and
    multi-axis ones. torch 2.13's inductor once left the last partial grid row's rows unwritten
    (``arange(T) // w``), so 2-D RoPE's compiled logits were off by 1e-2 at positions >= 16."""
    model = tiny_model(name)
    x = torch.randint(0, 64, (2, T_AXES), generator=torch.Generator().manual_seed(0))
    for make in (lambda: None, lambda: _axes_seq(axes)):
        torch._dynamo.reset()
        run = lambda tokens: model(tokens, make())  # noqa: E731
        with torch.no_grad():
            want = run(x)
            got = torch.compile(run)(x)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# Every training-free method (posenc.methods.METHODS) with groups / windows / chunks of 16
# positions, so that 20 and 37 positions end in a partial one; a new method fails here until
# it has an entry (KeyError), it is not skipped.
METHOD_PARAMS = {"self_extend": {"group_size": 16, "neighbor_window": 4}, "rerope": {"window": 16, "slope": 0.5},
                 "dual_chunk": {"chunk_size": 16, "local_size": 4}}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_positions_compiled_equal_eager(name):
    """A method's rotated positions and its choice of rotation per (query, key), computed inside
    a compiled graph from arange positions: torch 2.13's inductor once left Self-Extend's
    grouped positions (``torch.div(p, G, rounding_mode="floor")``) unwritten past the last full
    group, uninitialised memory read as positions."""
    method = build_method(name, **METHOD_PARAMS[name])

    def run(x):
        pos = torch.arange(x.shape[0])[None]  # (1, T), made in the graph as the model makes them
        return [t for pair in method.rotations(pos, pos) for t in pair] + [method.select(pos, pos)]

    for T in (20, 37):
        torch._dynamo.reset()
        x = torch.zeros(T)
        for got, want in zip(torch.compile(run)(x), run(x), strict=True):
            assert torch.equal(got, want)
