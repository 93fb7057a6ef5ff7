"""On CUDA a document mask runs FlexAttention's compiled kernel (models/document_mask.py), and a packed batch's
summed loss and every gradient equal its documents' run one by one (fp32, TF32 off, within 1e-5), and those of
SDPA's boolean mask (the CPU's path) within 1e-5. The CPU tests (tests/models/test_document_mask.py) can run
FlexAttention's forward only, eager: this is where its kernel and backward are checked. Heads are 16 wide, the
narrowest its kernel takes (narrower ones take SDPA's mask: a decision the CPU tests pin)."""
import pytest
import torch

from shardtrain.models import document_mask

from packed_documents import DOCUMENT_IDS, batch, documents, llama, loss_and_grads, transformer_lm

MODELS = {"llama GQA": lambda: llama(dim=64, heads=4, kv_heads=2),
          "transformer_lm learned": lambda: transformer_lm(True, dim=32, heads=2)}


@pytest.fixture(autouse=True)
def no_tf32():
    """fp32 matmuls in fp32: TF32's 10-bit mantissa would be the difference measured."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _close(got, expected, what):
    loss, grads = got
    loss_ref, grads_ref = expected
    assert abs(loss - loss_ref) <= 1e-5 * abs(loss_ref), (what, loss, loss_ref)
    for key, ref in grads_ref.items():
        worst = (grads[key] - ref).abs().max().item()
        assert worst <= 1e-5 * max(1.0, ref.abs().max().item()), f"{what}, {key}: {worst:.3g}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_flex_attention_on_cuda_gives_the_documents_one_by_one(name, monkeypatch):
    model = MODELS[name]().cuda()
    ids = DOCUMENT_IDS.cuda()
    assert isinstance(document_mask.attention_mask(ids, model.head_dim), document_mask.BlockMask)
    calls, compiled = [], document_mask._compiled_flex
    monkeypatch.setattr(document_mask, "_compiled_flex", lambda: calls.append(1) or compiled())
    tokens, target = batch("cuda")
    flex = loss_and_grads(model, [(tokens, target)], document_ids=ids)
    assert len(calls) == 2  # each block's attention ran the compiled kernel
    _close(flex, loss_and_grads(model, list(documents(tokens, target))), "one by one")
    monkeypatch.setattr(document_mask, "use_flex", lambda device, head_dim, dropout: False)
    _close(flex, loss_and_grads(model, [(tokens, target)], document_ids=ids), "SDPA's mask")
    causal = loss_and_grads(model, [(tokens, target)])[0]  # the documents see each other: the test can fail
    assert abs(causal - flex[0]) > 1e-2 * abs(flex[0])
