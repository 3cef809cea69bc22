"""posenc.hf.patch_model / unpatch_model on tiny random transformers models of every family.

References: the unpatched model itself (same config => same logits), transformers' own rope
types (a model built with that ``rope_parameters`` and the same weights), and for what
transformers lacks an explicit table written here from the formula (GPT-J linear scaling,
static NTK as a plain base).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5", reason="posenc.hf needs transformers>=5 (posenc[hf])")

from posenc.hf import PosencRotary, patch_model, patched_rope, unpatch_model  # noqa: E402
from posenc.encoding import Dims  # noqa: E402
from posenc.rotary import RotaryConfig, RotaryEmbedding, from_hf  # noqa: E402

from hf_helpers import generate_unpatched_then_patched, logits, rel, tokens  # noqa: E402

VOCAB, L = 64, 16  # L: max_position_embeddings, the "trained" length of the tiny models
_GQA = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64)
FAMILIES = {  # model_type -> (config class, causal LM class, config kwargs)
    "llama": ("LlamaConfig", "LlamaForCausalLM", _GQA),
    "mistral": ("MistralConfig", "MistralForCausalLM", _GQA | {"head_dim": 8}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _GQA),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _GQA | {"head_dim": 8}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", _GQA | {"head_dim": 8}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", _GQA | {"head_dim": 8}),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(hidden_size=64, num_attention_heads=4, intermediate_size=64,
                                                partial_rotary_factor=0.5)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", _GQA | {"hidden_size": 64, "partial_rotary_factor": 0.25}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", _GQA | {"partial_rotary_factor": 0.5, "pad_token_id": 0,
                                                      "original_max_position_embeddings": L,  # top level, as Phi-3
                                                      "bos_token_id": 1, "eos_token_id": 2}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM",
                 dict(hidden_size=64, num_attention_heads=4, intermediate_size=64, rotary_pct=0.5,
                      bos_token_id=1, eos_token_id=2)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(n_embd=32, n_head=4, rotary_dim=4, n_inner=64,
                                                   bos_token_id=1, eos_token_id=2)),
}
# transformers' rope types and their parameters
HF_TYPES = {
    "linear": {"factor": 2.0},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": L},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": L},
    "longrope": {"factor": 2.0, "original_max_position_embeddings": L},  # + factors per rotary_dim
}
# the families whose transformers config takes each rope type (Phi-3: longrope only; GPT-J: none)
TYPE_FAMILIES = [(f, t) for f in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gpt_neox") for t in HF_TYPES]
TYPE_FAMILIES += [(f, "yarn") for f in ("gemma2", "phi", "stablelm")]
TYPE_FAMILIES += [("phi3", "longrope")]


def make(name: str, **over) -> torch.nn.Module:
    cfg_cls, lm_cls, kw = FAMILIES[name]
    sizes = dict(n_layer=2, n_positions=L) if name == "gptj" else dict(num_hidden_layers=2, max_position_embeddings=L)
    # initializer_range 0.2 (not 0.02): attention far from uniform, so positions move the logits
    cfg = getattr(transformers, cfg_cls)(vocab_size=VOCAB, initializer_range=0.2, **(sizes | kw | over))
    torch.manual_seed(0)
    return getattr(transformers, lm_cls)(cfg).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each family saved with save_pretrained once; tests load their own copy back."""
    root = tmp_path_factory.mktemp("hf")
    for name in FAMILIES:
        make(name).save_pretrained(root / name)
    return root


def load(saved, name):
    return transformers.AutoModelForCausalLM.from_pretrained(saved / name, dtype=torch.float32).eval()


# ---- same config: same logits ----------------------------------------------------------------


@pytest.mark.parametrize("name", list(FAMILIES))
def test_same_config_same_logits_and_unpatch_restores_bitwise(saved, name):
    model = load(saved, name)
    base = model.base_model
    original = base.rotary_emb if name != "gptj" else None
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = tokens(2, 13)
    # packing: two documents in one row, positions restart at 0 (the model's own position_ids)
    packed = torch.tensor([[*range(6), *range(7)], [*range(13)]])
    # left padding: position ids count real tokens only, as generate() derives them
    mask = torch.tensor([[0, 0, 0, *[1] * 10], [1] * 13])
    padded = (mask.cumsum(-1) - 1).clamp(min=0)
    cases = [{}, {"position_ids": packed}, {"attention_mask": mask, "position_ids": padded}]
    want = [logits(model, ids, **kw) for kw in cases]
    assert rel(want[1], want[0]) > 1e-3  # the position ids matter, so using them is checked

    rope = patch_model(model)
    assert isinstance(rope, RotaryEmbedding) and patched_rope(model) is rope
    for kw, w in zip(cases, want):
        got = logits(model, ids, **kw)
        assert rel(got, w) <= 1e-5, (name, list(kw))
    assert model.state_dict().keys() == state.keys()  # save_pretrained writes the same checkpoint
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())

    assert unpatch_model(model) is True
    if original is not None:
        assert base.rotary_emb is original
    else:
        assert all("_get_embed_positions" not in m.__dict__ for m in model.modules())
    assert patched_rope(model) is None
    for kw, w in zip(cases, want):
        assert torch.equal(logits(model, ids, **kw), w)
    assert unpatch_model(model) is False  # nothing left to undo: a defined no-op


@pytest.mark.parametrize("name", list(FAMILIES))
def test_generate_with_cache_and_left_padding_equals_unpatched(saved, name):
    model = load(saved, name)
    want, got = generate_unpatched_then_patched(model, tokens(2, 9, seed=2), pad=4)  # row 0 left-padded
    assert torch.equal(got.sequences, want.sequences)
    assert len(want.logits) == 6
    for g, w in zip(got.logits, want.logits):
        assert rel(g, w) <= 1e-5
    # the cached steps used the right positions: the last step's logits equal a full forward
    full_mask = torch.ones(2, 9 + 5, dtype=torch.long)
    full_mask[0, :4] = 0
    pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
    last = logits(model, got.sequences[:, :-1], attention_mask=full_mask, position_ids=pos)[:, -1]
    assert rel(got.logits[-1], last) <= 1e-5


# ---- scalings: transformers' own rope types -------------------------------------------------


def longrope_factors(r: int) -> dict:
    """short/long factors for r rotated channels (r/2 pairs), growing with the pair index."""
    return {"short_factor": [1.0 + 0.2 * i for i in range(r // 2)], "long_factor": [1.0 + i for i in range(r // 2)]}


@pytest.mark.parametrize("name,rope_type", TYPE_FAMILIES)
def test_scaling_equals_transformers_rope_type(name, rope_type):
    """The plain model patched with a scaling = transformers' model built with that rope type
    (same weights): within the trained length L and at 1.5 L (dynamic and longrope switch)."""
    plain = make(name)
    params = HF_TYPES[rope_type]
    if rope_type == "longrope":
        params = params | longrope_factors(from_hf(plain.config).rotary_dim)
    cfg = plain.config.to_dict()
    cfg["rope_parameters"] = dict(plain.config.rope_parameters) | {"rope_type": rope_type} | params
    hf = type(plain)(type(plain.config).from_dict(cfg)).eval()
    hf.load_state_dict(plain.state_dict())
    ids = tokens(2, L + L // 2, seed=3)
    # short first: transformers' dynamic module remembers the longest length it has seen (its
    # frequencies stay scaled after a longer call); posenc's is a pure function of the length
    want_short, want = logits(hf, ids[:, :L]), logits(hf, ids)
    assert rel(want, logits(plain, ids)) > 1e-4  # the scaling changes the logits
    patch_model(plain, scaling=rope_type, **params)
    assert rel(logits(plain, ids[:, :L]), want_short) <= 1e-5
    assert rel(logits(plain, ids), want) <= 1e-5
    # the scaled checkpoint itself, patched with its own config (from_hf reads the rope dict)
    rope = patch_model(hf)
    assert rope.config.scaling == rope_type
    assert rel(logits(hf, ids[:, :L]), want_short) <= 1e-5
    assert rel(logits(hf, ids), want) <= 1e-5


def test_scaling_defaults_trained_length_and_starts_from_the_checkpoint():
    """original_max_position_embeddings defaults to the checkpoint's length; each call starts
    from the checkpoint's own RoPE (not from the previous patch): base alone keeps its scaling."""
    model = make("llama", rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    rope = patch_model(model, scaling="yarn", factor=4.0)
    assert (rope.config.scaling, rope.config.original_max_position_embeddings) == ("yarn", L)
    rope = patch_model(model, base=500000.0)
    assert (rope.config.scaling, rope.config.factor, rope.config.base) == ("linear", 2.0, 500000.0)
    rope = patch_model(model, scaling="dynamic", factor=3.0)
    assert (rope.config.scaling, rope.config.factor, rope.config.original_max_position_embeddings) == (
        "dynamic", 3.0, L)
    assert patched_rope(model) is rope


@pytest.mark.parametrize("name", ["llama", "gpt_neox"])
def test_ntk_and_new_base_equal_transformers_default_with_that_theta(name):
    """Static NTK (no transformers type) is plain RoPE with base' = base * s^(r/(r-2))
    (bloc97 2023); r = 8 here. A new base is the same check with base' given."""
    plain = make(name)
    s, r = 4.0, 8
    ids = tokens(2, 20, seed=4)
    for over, theta in [({"scaling": "ntk", "factor": s}, 10000.0 * s ** (r / (r - 2))), ({"base": 123.0}, 123.0)]:
        cfg = plain.config.to_dict()
        cfg["rope_parameters"] = dict(plain.config.rope_parameters) | {"rope_theta": theta}
        hf = type(plain)(type(plain.config).from_dict(cfg)).eval()
        hf.load_state_dict(plain.state_dict())
        patch_model(plain, **over)
        assert rel(logits(plain, ids), logits(hf, ids)) <= 1e-5, over
        unpatch_model(plain)


def test_gptj_linear_scaling_equals_explicit_table():
    """GPT-J has no rope types in transformers: its sin/cos table written here for positions
    p / s (Position Interpolation, Chen et al. 2023), copied into every layer's buffer."""
    plain = make("gptj")
    s, r, T = 2.0, 4, 24  # T past n_positions = 16: the patched table grows, transformers' cannot
    ref = make("gptj", n_positions=T)
    ref.load_state_dict(plain.state_dict(), strict=False)
    inv = 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    ang = (torch.arange(T, dtype=torch.float64) / s)[:, None] * inv  # (T, r/2)
    table = torch.cat([ang.sin(), ang.cos()], dim=1).float()
    # transformers < 5.24: a table in each attention layer; from 5.24: one shared rotary_emb
    attns = [m for m in ref.modules() if hasattr(m, "embed_positions")]
    assert len(attns) in (1, 2)
    for m in attns:
        m.embed_positions.copy_(table)
    ids = tokens(2, T, seed=5)
    patch_model(plain, scaling="linear", factor=s)
    assert rel(logits(plain, ids), logits(ref, ids)) <= 1e-5


# ---- numerics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_angles_in_float64_whatever_the_model_dtype(dtype):
    """At position 2^20 float32 angles are off by up to 2^-5 rad (half an ulp of 2^20 * theta);
    posenc's cos/sin are the float64 values, rounded once to the model dtype."""
    model = make("llama").to(dtype)
    hf_rotary = model.base_model.rotary_emb
    patch_model(model)
    pos = torch.tensor([[2**20, 2**20 + 7, 3]])
    x = torch.zeros(1, dtype=dtype)
    cos, sin = model.base_model.rotary_emb(x, pos)
    assert cos.dtype == sin.dtype == dtype and cos.shape == (1, 3, 8)
    inv = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    ang = pos[..., None].double() * inv
    want_cos, want_sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(cos.double(), want_cos, rtol=0, atol=eps)
    torch.testing.assert_close(sin.double(), want_sin, rtol=0, atol=eps)
    hf_cos, _ = hf_rotary(torch.zeros(1), pos)  # transformers' float32 angles, for contrast
    assert (hf_cos.double() - want_cos).abs().max() > 1e-3


def test_patched_model_survives_dtype_cast_and_unpatch():
    model = make("qwen2")
    patch_model(model, scaling="linear", factor=2.0)
    model.to(torch.bfloat16)
    ids = tokens(1, 10)
    assert logits(model, ids).dtype == torch.bfloat16
    assert patched_rope(model).inv_freq.dtype == torch.float64  # not rounded by the cast
    unpatch_model(model)
    assert model.base_model.rotary_emb.inv_freq.dtype == torch.bfloat16  # cast with the model, as unpatched


@pytest.mark.parametrize("name", ["llama", "gptj"])
def test_patched_model_trains_after_running_in_inference_mode(name):
    """cos/sin tables first built under torch.inference_mode() must not break a later training
    step (autograd cannot save inference tensors for backward)."""
    model = make(name)
    patch_model(model, scaling="linear", factor=2.0)
    ids = tokens(2, 12)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
    model.train()
    model(ids, labels=ids).loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.compile
@pytest.mark.slow
def test_patched_model_under_torch_compile():
    """torch.compile of a patched model (dynamic NTK: the length-dependent path) equals eager."""
    model = make("llama")
    patch_model(model, scaling="dynamic", factor=2.0)
    ids = tokens(2, L + 4)
    want = logits(model, ids)
    got = logits(torch.compile(model), ids)
    assert rel(got, want) <= 1e-5


# ---- errors ------------------------------------------------------------------------------------


def test_errors_leave_the_model_as_it_was():
    model = make("llama")
    original = model.base_model.rotary_emb
    with pytest.raises(ValueError, match=r"factor must be in \[1\.0, inf\), got 0\.5"):
        patch_model(model, scaling="linear", factor=0.5)
    with pytest.raises(TypeError, match="unknown parameter.*'fctor'"):
        patch_model(model, scaling="linear", fctor=2.0)
    dims = Dims(d_model=32, num_heads=4, head_dim=8)
    with pytest.raises(ValueError, match=r"rope.rotary_dim must be 8, the checkpoint's .*got 4"):
        patch_model(model, RotaryEmbedding(RotaryConfig(rotary_dim=4), dims))
    with pytest.raises(ValueError, match=r"rope.layout must be 'half'.*got 'interleaved'"):
        patch_model(model, RotaryEmbedding(RotaryConfig(layout="interleaved"), dims))
    with pytest.raises(TypeError, match="rope must be a posenc RotaryEmbedding.*got str"):
        patch_model(model, "yarn")
    assert model.base_model.rotary_emb is original


def test_unsupported_and_non_rope_models_are_clear_errors():
    with pytest.raises(TypeError, match="model must be a transformers PreTrainedModel.*got Linear"):
        patch_model(torch.nn.Linear(2, 2))
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match=r"model_type 'gpt2' has no rotary embeddings.*supports: llama, mistral"):
        patch_model(gpt2)
    olmo = transformers.OlmoForCausalLM(transformers.OlmoConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16))
    with pytest.raises(ValueError, match=r"model_type must be one of llama, .*gptj for patch_model; got 'olmo'"):
        patch_model(olmo)
    with pytest.raises(TypeError, match="model must be a transformers PreTrainedModel"):
        unpatch_model(object())


def test_posenc_rotary_is_a_drop_in_for_transformers_module():
    """Same call, same shapes and dtype, same values as LlamaRotaryEmbedding (float32 error)."""
    model = make("llama")
    hf_rotary = model.base_model.rotary_emb
    ours = PosencRotary(from_hf(model.config), hf_rotary)
    pos = torch.tensor([[0, 1, 2, 9], [5, 4, 0, 1]])
    x = torch.zeros(2, 4, 32)
    for a, b in zip(ours(x, pos), hf_rotary(x, pos)):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert math.isclose(ours.rope.attention_factor, hf_rotary.attention_scaling)


def test_docs_hf_examples_run(saved):
    """Every Python block of docs/hf.md and README.md that loads a checkpoint and patches it (the
    five-line HF path) runs, on a tiny saved checkpoint in place of its placeholder path."""
    root = Path(__file__).resolve().parents[1]
    blocks = [b for page in ("docs/hf.md", "README.md") if (root / page).is_file()
              for b in re.findall(r"```python\n(.*?)```", (root / page).read_text(), re.S)
              if "from_pretrained(\"path/to/checkpoint\")" in b and "patch_model(" in b]
    assert blocks  # docs/hf.md has one
    for block in blocks:
        namespace: dict = {}
        exec(compile(block.replace("path/to/checkpoint", str(saved / "llama")), "docs", "exec"), namespace)
        model = namespace["model"]
        assert type(model.base_model.rotary_emb).__name__ == "LlamaRotaryEmbedding"  # unpatched at the end
        assert patched_rope(model) is None


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_rope_for_another_head_size_names_the_head_size(name):
    """A RoPE built for other heads has another rotary_dim too; the error names the cause."""
    model = make(name)
    native = from_hf(model.config)
    head = native.dims.head_dim
    wrong = Dims(d_model=4 * 2 * head, num_heads=4, head_dim=2 * head)
    rope = RotaryEmbedding(RotaryConfig(rotary_dim=native.rotary_dim * 2, layout=native.config.layout), wrong)
    with pytest.raises(ValueError, match=rf"^rope.head_dim must be {head}, the checkpoint's .*got {2 * head} "
                                         r"\(build it for the checkpoint's heads"):
        patch_model(model, rope)
    assert patched_rope(model) is None  # left as it was


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_new_scaling_defaults_to_the_one_trained_length(name):
    """patch_model's default original_max_position_embeddings is posenc.hf.trained_length of
    the config, for every family (GPT-J's n_positions included); YaRN takes it."""
    from posenc.hf import trained_length

    model = make(name)
    rope = patch_model(model, scaling="yarn", factor=2.0)
    assert rope.config.original_max_position_embeddings == trained_length(model.config) == L
