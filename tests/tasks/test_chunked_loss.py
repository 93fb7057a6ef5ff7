"""The chunked loss (tasks/chunked_loss.py) against plain unchunked torch: the loss, the nll and both gradients,
in fp32 and bf16, the incoming gradient (fp16's loss scale) threaded through, the whole batch's logits never
allocated, and the rule that picks the chunk count, by hand.

"Within 1e-6 relative" is of each tensor's scale: every element within 1e-6 of the reference's largest element.
An element-wise relative bound means nothing where a gradient is a sum that cancels (two orders of the same fp32
sum differ there by 1e-4 relative; measured 7e-5 on the fp32 case below), while the scale bound still fails a
gradient that is wrong anywhere: the mutants of benchmarks/mutants_chunked_loss.py are off by 1e-2 or more."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode  # torch's hook on every op: how "never allocated" is seen

from shardtrain.core.errors import ConfigError
from shardtrain.tasks import chunked_loss as chunked
from shardtrain.tasks.chunked_loss import check_largest_batch, check_requested, chunk_count, chunked_loss

PAD = 1
N, D, V = 37, 16, 101  # 37 rows: chunks of unequal sizes


def reference(features, weight, target, eps):
    """criterions.py's unchunked formula (fairseq's), written out: (loss, nll)."""
    lprobs = torch.log_softmax(F.linear(features, weight).float(), dim=-1)
    target = target[:, None]
    pad = target.eq(PAD)
    nll = -lprobs.gather(-1, target).masked_fill(pad, 0.0).sum()
    smooth = -lprobs.sum(-1, keepdim=True).masked_fill(pad, 0.0).sum()
    eps_i = eps / (V - 1)
    return (1.0 - eps - eps_i) * nll + eps_i * smooth, nll


def inputs(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    features = (2 * torch.randn(N, D, generator=gen)).to(dtype)
    weight = (0.5 * torch.randn(V, D, generator=gen)).to(dtype)
    target = torch.randint(0, V, (N,), generator=gen)
    target[::5] = PAD  # ignored rows, the first and last chunks' included
    return features, weight, target


def run(loss_fn, features, weight, target, scale=1.0):
    """(loss, nll, grad of features, grad of weight) of ``loss_fn``, backward from ``scale * loss``."""
    features, weight = features.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, nll = loss_fn(features, weight, target)
    (loss * scale).backward()
    return loss.detach(), nll.detach(), features.grad, weight.grad


def chunks_of(k, eps):
    return lambda f, w, t: chunked_loss(f, w, t, chunks=k, ignore_index=PAD, label_smoothing=eps)


def within(actual, expected, rel):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    scale = expected.double().abs().max()
    error = float((actual.double() - expected.double()).abs().max())
    assert error <= rel * float(scale), f"off by {error:.3g}, over {rel:g} x the largest element {float(scale):.3g}"


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("k", [2, 5, N])  # N: one row a chunk
def test_fp32_loss_nll_and_gradients_equal_the_unchunked_loss(k, eps):
    args = inputs()
    expected = run(lambda f, w, t: reference(f, w, t, eps), *args)
    actual = run(chunks_of(k, eps), *args)
    for got, want in zip(actual, expected):
        within(got, want, 1e-6)
    assert float(expected[2][::5].abs().max()) == 0.0  # ignored rows get no gradient
    if eps:
        assert float(expected[0]) != pytest.approx(float(expected[1]), rel=1e-3)  # smoothing moves the loss


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_bf16_is_as_close_to_exact_as_the_unchunked_bf16_loss(eps):
    """bf16 features and weight: the same dtypes as the unchunked bf16 path (bf16 projection, fp32 log-softmax,
    bf16 logit gradients); the weight's gradient is summed over chunks, so compared by how far each is from the
    exact (fp64) loss of the same bf16 inputs."""
    args = inputs(torch.bfloat16)
    exact = run(lambda f, w, t: reference(f.double(), w.double(), t, eps), *args)
    plain = run(lambda f, w, t: reference(f, w, t, eps), *args)
    mine = run(chunks_of(4, eps), *args)
    for got, want in zip(mine, plain):
        assert got.dtype == want.dtype
        within(got.float(), want.float(), 2e-2)  # a few bf16 steps (2^-8 = 3.9e-3)
    for got, ref, want in zip(mine, plain, exact):
        error = lambda x: float((x.double() - want).norm() / want.norm())  # noqa: E731
        assert error(got) <= 1.25 * error(ref) + 1e-6, (error(got), error(ref))


def test_the_incoming_gradient_scales_every_gradient():
    """fp16 training backpropagates loss x scale: the gradients must be scale x the loss's."""
    args = inputs()
    one = run(chunks_of(4, 0.1), *args)
    scaled = run(chunks_of(4, 0.1), *args, scale=1024.0)
    for got, want in zip(scaled[2:], one[2:]):
        within(got, 1024 * want, 1e-6)
    half = run(chunks_of(4, 0.1), *args, scale=0.5)
    within(half[3], 0.5 * one[3], 1e-6)
    # in fp16, as fp16 training runs it: the scaled logit gradients cast to fp16, as the unchunked loss's are
    args = inputs(torch.float16)
    for got, want in zip(run(chunks_of(4, 0.1), *args, scale=256.0)[2:],
                         run(lambda f, w, t: reference(f, w, t, 0.1), *args, scale=256.0)[2:]):
        within(got.float(), want.float(), 2e-3)  # fp16 steps: 2^-11 = 4.9e-4 (measured 0, and 4.1e-4 for the weight)


class LargestTensor(TorchDispatchMode):
    """Records the most elements any op's output had (the logits, if anything makes them whole)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_the_whole_batchs_logits_never_exist(eps):
    rows = 64
    features, weight = torch.randn(rows, 8, requires_grad=True), torch.randn(V, 8, requires_grad=True)
    target = torch.randint(0, V, (rows,))
    with LargestTensor() as plain:
        reference(features, weight, target, eps)[0].backward()
    with LargestTensor() as seen:
        chunked_loss(features, weight, target, chunks=4, ignore_index=PAD, label_smoothing=eps)[0].backward()
    assert plain.largest == rows * V  # the mode sees the logits when they are made
    assert seen.largest == rows // 4 * V  # one chunk's, in forward and in backward


def test_autocast_projects_in_its_dtype_as_the_unchunked_loss_does():
    args = inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = run(lambda f, w, t: reference(f, w, t, 0.1), *args)
        mine = run(chunks_of(3, 0.1), *args)
    bf16 = run(chunks_of(3, 0.1), *(a.bfloat16() if a.is_floating_point() else a for a in args))
    for got, want in zip(mine, plain):
        assert got.dtype == want.dtype  # fp32 leaves get fp32 gradients
        within(got, want, 2e-2)
    within(mine[0], bf16[0], 1e-6)  # the projection ran in bf16: the loss of bf16 inputs


def test_the_rule_by_hand():
    # 256 MiB of fp32 logits: 268,435,456 / (4 x 128,256) = 523 rows a chunk
    assert chunk_count(0, 4 * 2048, 128256, True) == 16  # ceil(8192 / 523)
    assert chunk_count(0, 523, 128256, True) == 1 and chunk_count(0, 524, 128256, True) == 2
    assert chunk_count(0, 8 * 1024, 50257, True) == 7  # GPT-2's vocabulary: 1,335 rows a chunk
    assert chunk_count(0, 16 * 512, 32000, True) == 4  # 2,097 rows a chunk
    assert chunk_count(0, 4 * 2048, 128256, False) == 1  # the model cannot: the whole batch
    assert chunk_count(0, 3, 100_000_000, True) == 3  # a vocabulary past the budget: a row a chunk
    assert chunk_count(5, 64, 101, True) == 5 and chunk_count(1, 64, 101, False) == 1  # as asked
    assert chunked.LOGITS_BUDGET == 256 * 2 ** 20


def test_refusals_name_the_flag_and_the_fix():
    with pytest.raises(ConfigError, match=r"--loss-chunks -1 is not a chunk count: use 0"):
        check_requested(-1)
    check_requested(0)
    with pytest.raises(ConfigError, match=r"--loss-chunks 65 splits .* this run's batches hold at most 64 tokens "
                                          r".* Use --loss-chunks 64 or fewer"):
        check_largest_batch(65, 64)
    check_largest_batch(64, 64)
    assert chunk_count(65, 64, 101, True) == 64  # a shorter batch than the run's largest: a chunk a row
    with pytest.raises(ConfigError, match=r"--loss-chunks 2 projects the logits chunk by chunk, which this run "
                                          r"cannot: .*features_only.*--find-unused-parameters.*Use --loss-chunks 1"):
        chunk_count(2, 64, 101, False)
