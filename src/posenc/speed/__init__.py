"""Side-by-side timing benchmarks: ratios measured in one run, on one machine.

* :mod:`posenc.speed.rope`: rotating q and k, against transformers, Liger-Kernel, flash-attn
  and a copy;
* :mod:`posenc.speed.relative`: relative-attention terms and biased SDPA against a materialized
  (T, T, D) table and plain attention;
* :mod:`posenc.speed.model`: a whole model's training step and decoding, as ratios to NoPE;
* :mod:`posenc.speed.timing`: the timers, peak memory and the machine's description they share.

``posenc speed TARGET`` (:mod:`posenc.cli.speed`) runs them from the command line.
"""
