"""Attention backends: eager (the readable reference), sdpa and flex.

Each backend computes softmax(q·kᵀ·scale + logit terms + mask)·v (+ value terms) from the
same inputs: the per-forward mask description and the encoding's logit terms
(:mod:`posenc.terms`). The table of backends and the choice among them live here.
"""
