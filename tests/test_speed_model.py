"""``posenc speed model``'s measurement: each encoding alternates with NoPE (paired), and the
table reads the paired ratios, not quotients of numbers measured at different times."""

from __future__ import annotations

from posenc.speed.model import format_table, row_ratios, run_model_speed


def _results(with_ratio: bool) -> dict:
    res = {
        "machine": "test machine",
        "train": {"none": {64: 2.0}, "alibi": {64: 3.0}},
        "decode": {"none": {128: 100.0}, "alibi": {128: 50.0}},
        "memory": {"none": {64: 1000}, "alibi": {64: 1050}},
        "goal": {"none": ("absolute", 1.05, None), "alibi": ("bias", 1.15, 1.10)},
    }
    if with_ratio:  # measured in pairs: alibi's steps were 1.10x and 1.05x its NoPE partner's
        res["ratio"] = {"train": {"none": {64: 1.0}, "alibi": {64: 1.10}},
                        "decode": {"none": {128: 1.0}, "alibi": {128: 1.05}}}
    return res


def test_table_reads_the_paired_ratios():
    paired = format_table(_results(True)).splitlines()[2].split()
    assert paired[0] == "alibi" and "1.10x" in paired and "1.05x" in paired and paired[-1] == "yes"
    # An older file without paired ratios: quotients of the absolute numbers (3 / 2, 100 / 50).
    assert row_ratios(_results(False), "alibi") == ({64: 1.5}, {128: 2.0})
    old = format_table(_results(False)).splitlines()[2].split()
    assert "1.50x" in old and "2.00x" in old and old[-1] == "NO"


def test_paired_run_has_every_row_and_nope_at_one():
    res = run_model_speed(["learned", "none", "alibi", "learned"], [16], batch=1, layers=1, width=32, heads=2,
                          rounds=2, decode_contexts=[8], decode_tokens=2, progress=False)
    assert list(res["train"]) == list(res["decode"]) == list(res["memory"]) == ["none", "learned", "alibi"]
    assert res["ratio"]["train"]["none"] == {16: 1.0} and res["ratio"]["decode"]["none"] == {8: 1.0}
    for name in ("learned", "alibi"):
        (r_train,), (r_decode,) = res["ratio"]["train"][name].values(), res["ratio"]["decode"][name].values()
        assert 0 < r_train < 100 and 0 < r_decode < 100
        assert res["train"][name][16] > 0 and res["decode"][name][8] > 0 and res["memory"][name][16] > 0
        spread = res["rounds"][name][16]  # every round's ratio is kept; the reported one is their median
        assert len(spread) == 2 and abs(sorted(spread)[0] + sorted(spread)[1] - 2 * r_train) < 1e-3
    alone = run_model_speed(["none"], [16], batch=1, layers=1, width=32, heads=2, rounds=1,
                            decode_contexts=[8], decode_tokens=1, progress=False)
    assert list(alone["train"]) == ["none"] and alone["ratio"]["train"]["none"] == {16: 1.0}


def test_bad_settings_are_refused_by_name():
    import pytest

    base = dict(batch=1, layers=1, width=32, heads=2, rounds=1, decode_contexts=[8], decode_tokens=1, progress=False)
    for field, value, kind in (("rounds", 0, ValueError), ("decode_tokens", 0, ValueError), ("batch", 1.5, TypeError)):
        with pytest.raises(kind, match=field):
            run_model_speed(["none"], [16], **{**base, field: value})
    with pytest.raises(ValueError, match="lengths"):
        run_model_speed(["none"], [], **base)
    with pytest.raises(ValueError, match="divisible by heads"):
        run_model_speed(["none"], [16], **{**base, "heads": 3})
    with pytest.raises(ValueError, match="decode_contexts"):
        run_model_speed(["none"], [16], **{**base, "decode_contexts": [0]})


def test_json_file_is_replaced_whole_by_concurrent_writers(tmp_path):
    """Two writers of one --json file (two runs on one output path): every read sees one
    writer's whole document, never a mix, and no temporary file is left behind."""
    import json
    import os
    import threading

    from posenc.cli.args import emit_json

    path = tmp_path / "out" / "model.json"
    payloads = [{"writer": "short"}, {"writer": "long", "pad": "x" * 50_000}]
    stop = threading.Event()

    def write(data):
        while not stop.is_set():
            emit_json(path, data)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    emit_json(path, payloads[0])
    for t in threads:
        t.start()
    try:
        for _ in range(300):
            assert json.loads(path.read_text()) in payloads
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert [p.name for p in path.parent.iterdir()] == ["model.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # a plain file's permissions, not a temp file's 0600


def test_flops_ratio_counts_the_widened_q_k_of_pope_by_hand():
    """PoPE's q·k is 2D wide: its FLOPs ratio to NoPE, counted by hand for one shape (per token:
    projections 4C², MLP 8C², head C·V; per key and head q·k at 2D or D, p·v at D), and 1 for
    an encoding that keeps the width."""
    from posenc.model import Transformer
    from posenc.model_config import ModelConfig
    from posenc.speed.model import flops_ratio, qk_width

    C, L, H, V = 64, 3, 4, 50
    D = C // H
    pope = Transformer(ModelConfig(vocab_size=V, d_model=C, n_layer=L, n_head=H, encoding="pope"))
    rope = Transformer(ModelConfig(vocab_size=V, d_model=C, n_layer=L, n_head=H, encoding="rope"))
    assert qk_width(pope.encodings[0]) == 2 * D and qk_width(rope.encodings[0]) == D
    for keys in (8.5, 100.0):
        dense = L * 12 * C * C + C * V
        want = (dense + L * H * keys * 3 * D) / (dense + L * H * keys * 2 * D)
        assert abs(flops_ratio(pope, keys) - want) < 1e-12 and flops_ratio(rope, keys) == 1.0
        # A training step, products listed one by one. Dense: forward, then the input's and the
        # weight's gradient. Attention per query, key and head, at q·k's width w and v's D:
        # forward q·kᵀ (w), p·v (D); backward dv = Pᵀ·dO (D), dP = dO·vᵀ (D), dq (w), dk (w),
        # and with a flash backward q·kᵀ again (w).
        for recompute in (True, False):
            def attention(w):
                return w + D + D + D + w + w + (w if recompute else 0)
            want = (3 * dense + L * H * keys * attention(2 * D)) / (3 * dense + L * H * keys * attention(D))
            got = flops_ratio(pope, keys, backward=True, recompute=recompute)
            assert abs(got - want) < 1e-12
            assert flops_ratio(rope, keys, backward=True, recompute=recompute) == 1.0
        # the flash backward's recompute is at the wide width: it raises PoPE's ratio
        assert flops_ratio(pope, keys, backward=True) > flops_ratio(pope, keys, backward=True, recompute=False)


def test_a_goal_scaled_by_flops_is_checked_per_column():
    """A row with FLOPs ratios has each column's goal scaled by its own ratio: 1.10x training
    within 1.05 x 1.07, 1.30x decoding within 1.05 x 1.285, but not 1.20x training."""
    from posenc.speed.model import column_goals, goal_label, within_goal

    res = _results(True)
    res["goal"]["alibi"] = ("rotary/absolute", 1.05, 1.3)
    res["flops_ratio"] = {"none": {"train": {64: 1.0}, "decode": {128: 1.0}},
                          "alibi": {"train": {64: 1.07}, "decode": {128: 1.285}}}
    res["ratio"]["decode"]["alibi"][128] = 1.30
    train, decode = column_goals(res, "alibi")
    assert abs(train[64] - 1.1235) < 1e-9 and abs(decode[128] - 1.34925) < 1e-9
    assert within_goal(res, "alibi") and "FLOPs ratio (1.12, 1.35)" in goal_label(res, "alibi")[0]
    res["ratio"]["train"]["alibi"][64] = 1.20
    assert not within_goal(res, "alibi") and format_table(res).splitlines()[2].split()[-1] == "NO"
    del res["flops_ratio"]  # an older file: the class goal alone
    assert column_goals(res, "alibi") == ({64: 1.05}, {128: 1.05})


def test_isolated_rows_are_measured_in_processes_of_their_own_and_merged():
    """isolate=True: each encoding runs in a spawned process with a NoPE of its own, one at a
    time; the merged result has every row in order, NoPE first at 1.0, each row's own paired
    ratios, and NoPE's absolute numbers as the median of the processes' own."""
    kw = dict(batch=1, layers=1, width=32, heads=2, rounds=1, decode_contexts=[8], decode_tokens=1, progress=False)
    res = run_model_speed(["alibi", "none", "learned"], [16], isolate=True, **kw)
    assert res["settings"]["isolate"] is True
    for key in ("train", "decode", "memory", "goal", "flops_ratio"):
        assert list(res[key]) == ["none", "alibi", "learned"], key
    assert list(res["ratio"]["train"]) == ["none", "alibi", "learned"] and res["ratio"]["decode"]["none"] == {8: 1.0}
    assert 0 < res["ratio"]["train"]["alibi"][16] < 100 and len(res["rounds"]["learned"][16]) == 1
    assert "1.00x" in format_table(res).splitlines()[1]  # the table renders the merged result
    with __import__("pytest").raises(TypeError, match="isolate"):
        run_model_speed(["none"], [16], isolate="yes", **kw)
