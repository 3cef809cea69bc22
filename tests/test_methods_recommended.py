"""``recommended(trained, target)`` of each attention method: the rule its docstring states
(re-derived here by a search, not by the same formula), parameters that build a valid method, and
the point of the rule: at the target length no pair is rotated farther apart than the model was
trained on. The distances are read from the method's own ``rotations`` and ``select`` on
positions 0..N-1, query row by query row."""

from __future__ import annotations

import pytest
import torch

from posenc.methods import METHODS, build_method
from posenc.methods.dual_chunk import DualChunk
from posenc.methods.rerope import ReRoPE
from posenc.methods.self_extend import MAX_WINDOW, SelfExtend

PAIRS = [(L, N) for L in (8, 9, 64, 100, 256, 4096, 131_072)
         for N in sorted({1, L // 2, L - 1, L, L + 1, 2 * L, 3 * L + 5, 4 * L, 8 * L, 33 * L})]


def test_every_method_has_a_rule_and_a_label():
    assert set(METHODS) == {"self_extend", "rerope", "dual_chunk"}
    for name, cls in METHODS.items():
        assert cls.name == name and cls.label and "recommended" in vars(cls)  # its own rule, not the base's


@pytest.mark.parametrize("L,N", PAIRS)
def test_self_extend_is_a_quarter_window_and_the_smallest_sufficient_group(L, N):
    """W = L / 4; G the smallest group whose extended window (L - W) G + W reaches N (found by
    counting up from 1)."""
    W = L // 4
    G = 1
    while (L - W) * G + W < N:
        G += 1
    assert SelfExtend.recommended(L, N) == dict(group_size=G, neighbor_window=W)


def test_self_extend_at_the_papers_llama2_length():
    """Llama-2 (L = 4096, the paper's W = 1024) to 16k: (4096 - 1024) 5 + 1024 = 16384 exactly, so
    G = 5 reaches it and one more token needs G = 6."""
    assert SelfExtend.recommended(4096, 16384) == dict(group_size=5, neighbor_window=1024)
    assert SelfExtend.recommended(4096, 16385)["group_size"] == 6


@pytest.mark.parametrize("L,N", PAIRS)
def test_rerope_is_an_eighth_window_without_leak(L, N):
    assert ReRoPE.recommended(L, N) == dict(window=L // 8, slope=0.0)


def test_rerope_matches_the_authors_script():
    assert ReRoPE.recommended(4096, 16384)["window"] == 512  # rerope_patch.py: training_length 4096, window 512


@pytest.mark.parametrize("L,N", PAIRS)
def test_dual_chunk_is_three_quarters_chunk_and_an_eighth_local(L, N):
    assert DualChunk.recommended(L, N) == dict(chunk_size=3 * L // 4, local_size=L // 8)


@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.parametrize("L,N", PAIRS)
def test_recommended_parameters_build_the_method(name, L, N):
    params = METHODS[name].recommended(L, N)
    method = build_method(name, **params)
    assert isinstance(method, METHODS[name]) and method.params() == params


def rotated_distances(method, N: int) -> torch.Tensor:
    """The distance q - k each causal pair (m >= n) of positions 0..N-1 is rotated at: for each
    query row m, the rotation ``select`` picks for every key n, then that rotation's q - k."""
    pos = torch.arange(N)[None]  # (1, N)
    rot = method.rotations(pos, pos)  # R pairs of ((1, N), (1, N))
    rows = []
    for m in range(N):
        n = torch.arange(m + 1)
        r = method.select(torch.tensor([[[m]]]), n[None, None])[0, 0]  # (m + 1,)
        q = torch.stack([qr[0, m] for qr, _ in rot])[r]  # (m + 1,)
        k = torch.stack([kr[0] for _, kr in rot])[r, n]  # (m + 1,)
        rows.append(q - k)
    return torch.cat(rows)


DISTANCE_PAIRS = [(L, N) for L in (8, 12, 64, 100) for N in (L - 1, L + 1, 2 * L, 3 * L + 5, 8 * L)]


@pytest.mark.parametrize("name", list(METHODS))
@pytest.mark.parametrize("L,N", DISTANCE_PAIRS)
def test_no_pair_is_rotated_past_the_trained_length(name, L, N):
    """Every causal pair of an N-token sequence is rotated at a distance in [0, L): the distances
    the model saw in training (Self-Extend's fractional shift W - W / G included)."""
    method = build_method(name, **METHODS[name].recommended(L, N))
    d = rotated_distances(method, N)
    assert d.numel() == N * (N + 1) // 2
    assert d.min() >= 0 and d.max() < L, (float(d.min()), float(d.max()))


@pytest.mark.parametrize("L,N", [(64, 8 * 64), (100, 3 * 100 + 5)])
def test_the_distance_bounds_are_the_methods_own(L, N):
    """The bound is reached, not just respected: ReRoPE's largest distance is its window, Dual
    Chunk's its chunk size at most, Self-Extend's close to L (the smallest group uses the room)."""
    re = rotated_distances(build_method("rerope", **ReRoPE.recommended(L, N)), N)
    assert float(re.max()) == L // 8
    dca = rotated_distances(build_method("dual_chunk", **DualChunk.recommended(L, N)), N)
    assert L // 2 < float(dca.max()) <= 3 * L // 4
    se = rotated_distances(build_method("self_extend", **SelfExtend.recommended(L, N)), N)
    assert L - 8 < float(se.max()) < L


def test_plain_lengths_leave_self_extend_plain():
    """Within L the smallest group is 1: Self-Extend is RoPE itself, every distance the true one."""
    L = 64
    method = build_method("self_extend", **SelfExtend.recommended(L, L))
    assert method.group_size == 1
    d = rotated_distances(method, L)
    true = torch.cat([m - torch.arange(m + 1) for m in range(L)]).double()
    assert torch.equal(d, true)


@pytest.mark.parametrize("cls,minimum", [(SelfExtend, 4), (ReRoPE, 8), (DualChunk, 8)])
@pytest.mark.parametrize("trained,target,error,match", [
    ("low", 100, ValueError, r"^trained must be in \[{m}, 9007199254740991\], got {low}$"),
    (0, 100, ValueError, r"^trained must be in \[{m}, 9007199254740991\], got 0$"),
    (MAX_WINDOW + 1, 100, ValueError, r"^trained must be in \[{m}, 9007199254740991\], got 9007199254740992$"),
    (64, 0, ValueError, r"^target must be in \[1, 9007199254740991\], got 0$"),
    (64, MAX_WINDOW + 1, ValueError, r"^target must be in \[1, 9007199254740991\], got 9007199254740992$"),
    (64.0, 100, TypeError, r"^trained must be an int, got float 64.0$"),
    (True, 100, TypeError, r"^trained must be an int, got bool True$"),
    (64, 128.0, TypeError, r"^target must be an int, got float 128.0$"),
])
def test_bad_trained_or_target_is_refused_naming_it(cls, minimum, trained, target, error, match):
    if trained == "low":
        trained = minimum - 1
    with pytest.raises(error, match=match.format(m=minimum, low=minimum - 1)):
        cls.recommended(trained, target)


@pytest.mark.parametrize("cls,minimum", [(SelfExtend, 4), (ReRoPE, 8), (DualChunk, 8)])
def test_the_smallest_trained_length_still_builds(cls, minimum):
    """The minimum is the smallest L whose rule gives valid parameters (one below would give a
    zero window)."""
    build_method(cls.name, **cls.recommended(minimum, 10 * minimum))


@pytest.mark.parametrize("L,N", PAIRS)
def test_the_small_grid_is_the_recommended_set_and_its_stated_neighbours(L, N):
    """``grid``: the recommended set first, then the neighbours each docstring names (spelt out
    here from the rule, not by calling it again), repeats dropped, every set a valid method."""
    def want(name):
        rec = METHODS[name].recommended(L, N)
        if name == "self_extend":
            W = max(1, L // 8)
            G = next(g for g in range(1, 40 * N + 2) if (L - W) * g + W >= N)
            sets = [rec, dict(group_size=G, neighbor_window=W), dict(rec, group_size=2 * rec["group_size"])]
        elif name == "rerope":
            w = L // 8
            sets = [rec, dict(window=max(1, w // 2), slope=0.0), dict(window=2 * w, slope=0.0),
                    dict(window=w, slope=1 / 16)]
        else:
            sets = [rec, dict(rec, chunk_size=L // 2), dict(rec, local_size=L // 16)]
        out = []
        for s in sets:
            if s not in out:
                out.append(s)
        return out

    for name, cls in METHODS.items():
        got = cls.grid(L, N)
        assert list(got) == want(name)
        for params in got:
            build_method(name, **params)
