"""The torch facts posenc relies on (:mod:`posenc.torch_facts`) still hold for the installed torch."""

from __future__ import annotations

import warnings

import torch

from posenc import torch_facts


def test_flex_cpu_backward_fact_holds():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex warns that it runs unfused without compile
        seen = torch_facts.flex_has_cpu_backward()
    assert seen == torch_facts.FLEX_HAS_CPU_BACKWARD, (
        f"torch {torch.__version__}: flex_attention's CPU backward {'runs' if seen else 'fails'}; "
        f"update posenc.torch_facts (observed with {torch_facts.OBSERVED_WITH}) and what reads it"
    )
