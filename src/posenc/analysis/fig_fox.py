"""FoX's figure: forget gates on a sentence and the bias they make (Lin et al. 2025, "Forgetting
Transformer: Softmax Attention with a Forget Gate").

Each token t opens a forget gate ``f_t = sigmoid(w·x_t + b)`` from the layer input, and the logit
of query i and key j <= i gains ``sum_{l=j+1}^{i} log f_l``. Here the layer input marks sentence
ends, and two heads read it: one whose gate closes on "." (it forgets everything before the
last sentence end, keeping the current sentence), and one with the same gate everywhere (ALiBi
with slope -log f). The bias is the real ``fox`` encoding's, through its ``terms`` hook.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..attention import Attention
from ..encoding import QKProjection
from ..registry import build
from .canvas import PlotResult, figure, save

__all__ = ["SENTENCE", "fox_sentence_bias", "plot_fox_forgetting"]

SENTENCE = "The cat sat . It purred . A dog barked twice . The cat left ."


def fox_sentence_bias(words: list[str], closed: float = -3.0, open_: float = 4.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(gates (2, T), bias (2, T, T)) float64 of a two-head ``fox`` encoding on ``words``. The
    layer input is [1, is "."] per token; head 0's gate logit is ``open_`` on words and
    ``closed`` on "."; head 1's is their mean on every token (one constant gate). Causal: keys
    after the query are NaN."""
    T = len(words)
    enc = build("fox", d_model=2, num_heads=2).double()
    with torch.no_grad():
        enc.gate.weight.copy_(torch.tensor([[0.0, closed - open_], [0.0, 0.0]], dtype=torch.float64))
        enc.gate.bias.copy_(torch.tensor([open_, (open_ + closed) / 2], dtype=torch.float64))
    x = torch.zeros(1, T, 2, dtype=torch.float64)
    x[0, :, 1] = torch.tensor([w == "." for w in words], dtype=torch.float64)
    handle = QKProjection.of(Attention(2, 2), x)
    q = torch.zeros(1, 2, T, 1, dtype=torch.float64)
    pos = torch.arange(T)[None]
    with torch.no_grad():
        gates = enc.log_gates(x)[0].exp()  # (2, T)
        bias = enc.score(q, q, pos, pos, proj=handle)[0]  # (2, T, T)
    j = torch.arange(T)
    return gates, torch.where(j[:, None] >= j[None, :], bias, torch.nan)


def plot_fox_forgetting(out_dir: Path, text: str = SENTENCE, closed: float = -3.0, open_: float = 4.0) -> PlotResult:
    """FoX's forget gates on a sentence and the bias they make (Lin et al. 2025): a gate that
    closes on "." forgets the earlier sentences; one constant gate is ALiBi."""
    words = text.split()
    T = len(words)
    gates, bias = fox_sentence_bias(words, closed, open_)
    plt, fig, (a0, a1) = figure(2)
    j = torch.arange(T)
    a0.step(j.numpy(), bias[0, -1].numpy(), where="mid", color="C3", label='gate closes on "."')
    a0.step(j.numpy(), bias[1, -1].numpy(), where="mid", color="C0", label="one constant gate (ALiBi)")
    a0.set_xticks(j.numpy(), words, rotation=60, ha="right", fontsize=8)
    a0.set_ylabel(f"bias d(i = {T - 1}, j) = Σ log f")
    a0.set_title("seen from the last token", fontsize=10)
    a0.legend(loc="upper left", fontsize=8)
    im = a1.imshow(bias[0].numpy(), cmap="magma", origin="upper")
    a1.set_xticks(j.numpy(), words, rotation=60, ha="right", fontsize=7)
    a1.set_yticks(j.numpy(), words, fontsize=7)
    a1.set_xlabel("key j")
    a1.set_ylabel("query i")
    a1.set_title('d(i, j), gate closing on "."', fontsize=10)
    fig.colorbar(im, ax=a1, label="logit bias (≤ 0)")
    return save(plt, fig, out_dir, "fox-forgetting", "FoX: forget gates of the tokens, summed between key and query",
                {"words": words, "gates": gates, "bias": bias, "closed": closed, "open": open_})
