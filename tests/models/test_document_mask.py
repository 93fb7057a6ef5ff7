"""Packed documents that do not see each other (models/document_mask.py), in both families: the summed loss and
every gradient of a packed batch equal those of its documents run one by one, each alone in a batch of 1 from
position 0 (fp32, within 1e-5), and without document ids the same batch differs. The batch (tests/helpers/
packed_documents.py) has a document cut at a row's start, one cut at its end, one of a single token and right
padding. Rotary positions are relative (q.k depends on the distance only), so llama's loss cannot show whether
its positions restart: the positions its rotation is given are checked directly."""
import pytest
import torch

from shardtrain.core.errors import ConfigError
from shardtrain.models import document_mask
from shardtrain.models.positions import document_positions

from packed_documents import DOCUMENT_IDS, PAD, batch, documents, llama, loss_and_grads, transformer_lm

MODELS = {"llama GQA rotary": llama, "transformer_lm learned": lambda: transformer_lm(True),
          "transformer_lm sinusoidal": lambda: transformer_lm(False)}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_packed_batch_is_its_documents_one_by_one(name):
    model = MODELS[name]()
    tokens, target = batch()
    packed, packed_grads = loss_and_grads(model, [(tokens, target)], document_ids=DOCUMENT_IDS)
    alone, alone_grads = loss_and_grads(model, list(documents(tokens, target)))
    assert abs(packed - alone) <= 1e-5 * abs(alone), (packed, alone)
    for key, expected in alone_grads.items():
        worst = (packed_grads[key] - expected).abs().max().item()
        assert worst <= 1e-5 * max(1.0, expected.abs().max().item()), f"{key}: {worst:.3g}"
    causal, _ = loss_and_grads(model, [(tokens, target)])  # the documents see each other: the test can fail
    assert abs(causal - alone) > 1e-2 * abs(alone), (causal, alone)


def test_llamas_rotation_restarts_at_each_document(monkeypatch):
    import shardtrain.models.llama.model as llama_model

    seen = []
    real = llama_model.cos_sin
    monkeypatch.setattr(llama_model, "cos_sin", lambda inv, positions, dtype: seen.append(positions) or
                        real(inv, positions, dtype))
    tokens, _ = batch()
    llama()(tokens, document_ids=DOCUMENT_IDS)
    assert seen[0].tolist() == [[0, 1, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4],  # by hand, from DOCUMENT_IDS
                                [0, 1, 2, 0, 0, 1, 2, 3, 0, 1, 2, 3]]


def test_fairseq_positions_restart_and_pads_keep_the_padding_position():
    tokens = torch.tensor([[7, 8, 2, 9, 9, 2, 5, PAD]])
    ids = torch.tensor([[0, 0, 1, 1, 1, 2, 2, 2]])
    # fairseq numbers a document's tokens from padding_idx + 1 = 2; pad gets padding_idx = 1
    assert document_positions(tokens, PAD, ids).tolist() == [[2, 3, 2, 3, 4, 2, 3, 1]]


def test_the_mask_is_causal_within_each_document():
    mask = document_mask.attention_mask(torch.tensor([[0, 0, 1, 1, 1], [5, 5, 5, 5, 5]]), head_dim=16)
    assert mask.shape == (2, 1, 5, 5) and mask.dtype == torch.bool
    assert mask[0, 0].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0],
                                         [0, 0, 1, 1, 1]]
    assert mask[1, 0].int().tolist() == torch.ones(5, 5).tril().int().tolist()  # one document: causal


def test_flex_attention_only_on_cuda_for_heads_of_16_without_attention_dropout():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # a decision: no GPU needed
    assert document_mask.use_flex(cuda, 16, 0.0) and document_mask.use_flex(cuda, 24, 0.0)
    assert not document_mask.use_flex(cuda, 8, 0.0)  # its kernel's tl.dot needs 16
    assert not document_mask.use_flex(cuda, 16, 0.1)  # no dropout
    assert not document_mask.use_flex(cpu, 16, 0.0)  # no backward


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")  # eager: the CPU has no kernel
@pytest.mark.parametrize("name", sorted(MODELS))
def test_flex_attentions_mask_gives_what_sdpas_does_on_the_cpu(name, monkeypatch):
    """FlexAttention has no backward on the CPU (torch 2.13 refuses it): its forward, eager, is compared here;
    tests/gpu/test_document_mask_gpu.py compares the compiled kernel's forward and backward on CUDA."""
    model = MODELS[name]().eval()
    tokens, _ = batch()
    with torch.no_grad():
        sdpa = model(tokens, document_ids=DOCUMENT_IDS)
        monkeypatch.setattr(document_mask, "use_flex", lambda device, head_dim, dropout: True)
        assert isinstance(document_mask.attention_mask(DOCUMENT_IDS, 16), document_mask.BlockMask)
        calls, kernel = [], document_mask.flex_attention
        monkeypatch.setattr(document_mask, "flex_attention", lambda *a, **k: calls.append(1) or kernel(*a, **k))
        flex = model(tokens, document_ids=DOCUMENT_IDS)
    assert len(calls) == 2  # each block's attention ran FlexAttention
    assert (flex - sdpa).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", sorted(MODELS))
def test_document_ids_with_a_kv_cache_are_refused(name):
    model = MODELS[name]()
    tokens, _ = batch()
    with pytest.raises(ConfigError, match="given document_ids and a KV cache together.*without document_ids"):
        model(tokens, cache=model.new_kv_cache(), document_ids=DOCUMENT_IDS)
