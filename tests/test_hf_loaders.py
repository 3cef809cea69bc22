"""posenc.hf.relative_from_bert / relative_from_deberta: checkpoint weights into posenc encodings.

BERT: transformers 5 no longer runs relative_key, so the reference is transformers 4's
``BertSelfAttention`` formula written out here (v4.46 ``modeling_bert.py``: ``distance =
position_ids_l - position_ids_r``, row ``distance + max_position_embeddings - 1``, the q (and k)
terms added to q·kᵀ before the division by sqrt(D)), on q and k from a real transformers
``BertModel`` checkpoint to which a v4-style ``distance_embedding`` was added.
DeBERTa-v2: the reference is transformers' own ``DebertaV2Model`` (its attention probabilities).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5", reason="posenc.hf needs transformers>=5 (posenc[hf])")
from safetensors.torch import load_file, save_file  # noqa: E402

from posenc.hf import relative_from_bert, relative_from_deberta  # noqa: E402

F64 = torch.float64
C, H, P, N_LAYERS = 32, 4, 16, 2
D = C // H


def bert_checkpoint(folder, kind: str):
    """A tiny BertModel saved by transformers 5, plus what a transformers-4 relative_key
    checkpoint also holds: ``position_embedding_type`` and one distance_embedding per layer."""
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=C, num_hidden_layers=N_LAYERS, num_attention_heads=H,
                                  intermediate_size=64, max_position_embeddings=P)
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    model.save_pretrained(folder)
    state = load_file(folder / "model.safetensors")
    g = torch.Generator().manual_seed(1)
    tables = [torch.randn(2 * P - 1, D, generator=g) for _ in range(N_LAYERS)]
    for i, t in enumerate(tables):
        state[f"encoder.layer.{i}.attention.self.distance_embedding.weight"] = t
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["position_embedding_type"] = kind
    (folder / "config.json").write_text(json.dumps(config))
    return model, tables


def v4_bert_logits(att, table, x, q_pos, k_pos, kind):
    """transformers 4's relative_key(_query) logits, (B, H, Tq, Tk), float64."""
    B = x.shape[0]
    q = att.query(x[:, q_pos]).view(B, -1, H, D).transpose(1, 2).double()
    k = att.key(x[:, k_pos]).view(B, -1, H, D).transpose(1, 2).double()
    scores = q @ k.transpose(-1, -2)
    distance = q_pos[:, None] - k_pos[None, :]  # position_ids_l - position_ids_r
    pe = table.double()[distance + P - 1]  # (Tq, Tk, D)
    scores = scores + torch.einsum("bhld,lrd->bhlr", q, pe)
    if kind == "relative_key_query":
        scores = scores + torch.einsum("bhrd,lrd->bhlr", k, pe)
    return scores / math.sqrt(D), q, k


@pytest.mark.parametrize("kind", ["relative_key", "relative_key_query"])
def test_bert_relative_key_logits_equal_transformers_v4_formula(tmp_path, kind):
    model, tables = bert_checkpoint(tmp_path, kind)
    encs = relative_from_bert(tmp_path)
    assert len(encs) == N_LAYERS
    assert [type(e).__name__ for e in encs] == ["RelativeKey" if kind == "relative_key" else "RelativeKeyQuery"] * 2
    x = torch.randn(2, 11, C, generator=torch.Generator().manual_seed(2))
    T = x.shape[1]
    cases = [(torch.arange(T), torch.arange(T)), (torch.tensor([T - 1]), torch.arange(T))]  # full; one decode step
    for i, enc in enumerate(encs):
        assert torch.equal(enc.weight, tables[i])
        att = model.encoder.layer[i].attention.self
        for q_pos, k_pos in cases:
            with torch.no_grad():
                want, q, k = v4_bert_logits(att, tables[i], x, q_pos, k_pos, kind)
                enc64 = enc.double()
                scale = 1 / math.sqrt(D)
                got = q @ k.transpose(-1, -2) * scale + enc64.score(
                    q, k, q_pos.expand(2, -1), k_pos.expand(2, -1))
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_bert_loader_takes_a_state_dict_or_module_with_config(tmp_path):
    _, tables = bert_checkpoint(tmp_path, "relative_key_query")
    state = load_file(tmp_path / "model.safetensors")
    config = json.loads((tmp_path / "config.json").read_text())
    encs = relative_from_bert(state, config=config)
    assert [torch.equal(e.weight, t) for e, t in zip(encs, tables)] == [True, True]
    layer = torch.nn.Module()  # a v4 BertSelfAttention: its own distance_embedding, no layer index
    layer.distance_embedding = torch.nn.Embedding(2 * P - 1, D)
    (one,) = relative_from_bert(layer, config=config)
    assert torch.equal(one.weight, layer.distance_embedding.weight)


def test_bert_loader_errors(tmp_path):
    model, _ = bert_checkpoint(tmp_path, "relative_key")
    with pytest.raises(ValueError, match=r"position_embedding_type must be one of 'relative_key', "
                                         r"'relative_key_query' for relative_from_bert; got 'absolute'"):
        relative_from_bert(model)  # a transformers 5 BertModel: absolute positions only
    config = json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(ValueError, match="no distance_embedding.weight in the source"):
        relative_from_bert({}, config=config)
    with pytest.raises(ValueError, match=r"encoder.layer.0.attention.self.distance_embedding.weight must have "
                                         r"shape \(31, 8\) for this config, got \(9, 8\)"):
        relative_from_bert({"encoder.layer.0.attention.self.distance_embedding.weight": torch.zeros(9, D)},
                           config=config)
    with pytest.raises(ValueError, match="config is needed with a state dict"):
        relative_from_bert({})
    with pytest.raises(TypeError, match="source must be a checkpoint folder path, a torch module or a state dict, "
                                        "got int"):
        relative_from_bert(3)
    with pytest.raises(ValueError, match="folder '.*nowhere' does not exist"):
        relative_from_bert(tmp_path / "nowhere")


# ---- DeBERTa-v2 --------------------------------------------------------------------------------


def deberta(share: bool, pos_att_type=("c2p", "p2c"), norm="layer_norm"):
    cfg = transformers.DebertaV2Config(
        vocab_size=64, hidden_size=C, num_hidden_layers=N_LAYERS, num_attention_heads=H, intermediate_size=64,
        relative_attention=True, pos_att_type=list(pos_att_type), position_buckets=4, max_relative_positions=8,
        share_att_key=share, norm_rel_ebd=norm, max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.DebertaV2Model(cfg).to(F64).eval()
    with torch.no_grad():  # a non-trivial LayerNorm of the table
        model.encoder.LayerNorm.weight.normal_(1.0, 0.1)
        model.encoder.LayerNorm.bias.normal_(0.0, 0.1)
    return model


def posenc_probs(model, encs, hidden, i):
    """Layer i's attention probabilities from posenc: q·kᵀ from the checkpoint's projections,
    plus the loaded encoding's position terms, at DeBERTa's scale."""
    att = model.encoder.layer[i].attention.self
    layer = torch.nn.Module()  # share_att_key: the table is projected by the layer's own q/k
    layer.q_proj, layer.k_proj = att.query_proj, att.key_proj
    layer.num_heads, layer.num_kv_heads, layer.head_dim = H, H, D  # as posenc's Attention names them
    B, T, _ = hidden.shape
    q = att.query_proj(hidden).view(B, T, H, D).transpose(1, 2)
    k = att.key_proj(hidden).view(B, T, H, D).transpose(1, 2)
    pos = torch.arange(T).expand(B, T)
    scale = encs[i].attention_scale(D)
    logits = q @ k.transpose(-1, -2) * scale + encs[i].score(q, k, pos, pos, layer=layer)
    return logits.softmax(-1)


@pytest.mark.parametrize("share,pos_att_type", [(False, ("c2p", "p2c")), (True, ("c2p", "p2c")), (False, ("c2p",)),
                                                (True, ("p2c",))])
def test_deberta_attention_equals_transformers(tmp_path, share, pos_att_type):
    model = deberta(share, pos_att_type)
    ids = torch.randint(0, 64, (2, 13), generator=torch.Generator().manual_seed(3))  # 13 > 8: the log buckets
    with torch.no_grad():
        out = model(ids, output_attentions=True, output_hidden_states=True)
    model.save_pretrained(tmp_path)
    for source in (model, tmp_path):
        encs = relative_from_deberta(source)
        encs = [e.double() for e in encs]
        assert len(encs) == N_LAYERS
        assert len(out.attentions) == N_LAYERS
        for i in range(N_LAYERS):
            with torch.no_grad():
                got = posenc_probs(model, encs, out.hidden_states[i], i)
            torch.testing.assert_close(got, out.attentions[i], rtol=1e-7, atol=1e-9)


def test_deberta_layers_share_the_table_as_the_checkpoint_does():
    encs = relative_from_deberta(deberta(False))
    assert encs[0] is not encs[1]
    assert encs[0].rel_embeddings is encs[1].rel_embeddings and encs[0].norm is encs[1].norm
    assert not torch.equal(encs[0].pos_key_proj.weight, encs[1].pos_key_proj.weight)  # per layer
    shared = relative_from_deberta(deberta(True))
    assert shared[0] is shared[1] and shared[0].pos_key_proj is None


def test_deberta_loader_errors():
    model = deberta(False)
    cfg = model.config.to_dict()
    with pytest.raises(ValueError, match="config\\['relative_attention'\\] must be true"):
        relative_from_deberta({}, config=cfg | {"relative_attention": False})
    with pytest.raises(ValueError, match="model_type must be 'deberta-v2' for relative_from_deberta; got 'bert'"):
        relative_from_deberta({}, config=cfg | {"model_type": "bert"})
    with pytest.raises(ValueError, match="expected one encoder.rel_embeddings.weight in the source, found 0"):
        relative_from_deberta({}, config=cfg)
    state = {k: v for k, v in model.state_dict().items() if "layer.1.attention.self.pos_" not in k}
    with pytest.raises(ValueError, match=r"found for layers \[0\]; expected 0..1"):
        relative_from_deberta(state, config=cfg)
    with pytest.raises(ValueError, match=r"pos_att_type'\] entries must be 'c2p' or 'p2c'; got \['c2c'\]"):
        relative_from_deberta({}, config=cfg | {"pos_att_type": ["c2c"]})


# ---- bad files: one line naming the file, for every loader ---------------------------------------


def _saved(folder, loader: str):
    """A good checkpoint folder for ``loader`` (safetensors + config.json)."""
    if loader == "bert":
        bert_checkpoint(folder, "relative_key")
    else:
        deberta(False).float().save_pretrained(folder)
    return folder


def _truncate_data(folder):
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    path.write_bytes(raw[: 8 + int.from_bytes(raw[:8], "little") + 64])  # the header intact, the data cut
    return path, r"is truncated: its header describes \d+ bytes, the file has \d+"


def _cut_header(folder):
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:40])
    return path, r"is truncated: its header length says \d+ bytes, 32 follow it"


def _not_json(folder):
    (folder / "config.json").write_text("{not json")
    return folder / "config.json", "is not valid JSON"


def _a_list(folder):
    (folder / "config.json").write_text("[1, 2]")
    return folder / "config.json", "must hold a JSON object, got list"


def _bad_bin(folder):
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not a zip")
    return folder / "pytorch_model.bin", "cannot be read as a torch state dict"


FAULTS = {"safetensors cut after its header": _truncate_data, "safetensors cut inside its header": _cut_header,
          "config.json not JSON": _not_json, "config.json a list": _a_list, "pytorch_model.bin corrupt": _bad_bin}
LOADERS = {"bert": relative_from_bert, "deberta": relative_from_deberta}


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("loader", list(LOADERS))
def test_a_bad_file_is_one_line_naming_it(tmp_path, loader, fault):
    """No bare JSONDecodeError, AttributeError ('list' has no 'get') or SafetensorError: a
    ValueError that starts with the file's path, from the checked reads in posenc.hf.checkpoint."""
    import re

    folder = _saved(tmp_path / "ckpt", loader)
    path, what = FAULTS[fault](folder)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:? {what}") as e:
        LOADERS[loader](folder)
    assert "\n" not in str(e.value)
