"""Peak memory of the chunked loss (``--loss-chunks``, shardtrain/tasks/chunked_loss.py) against the unchunked
loss, forward and backward, in the same run (issue 46).

    python benchmarks/chunked_loss.py [--vocab 128256 --batch 4 --length 2048 --width 512 --chunks 0 --bf16]

The loss alone, as ``cross_entropy`` computes it: the criterion's own code, on a stand-in model whose features
[batch, length, width] and output weight [vocab, width] are leaves that require gradients (nothing else is
allocated), fp32 (``--bf16``: both in bf16). Unchunked is ``--loss-chunks 1`` (forward's logits, then
cross_entropy on them, as before chunking existed); chunked is ``--chunks`` (default 0: the rule, 16 chunks of
512 tokens at the default sizes).

Memory is the live tensor bytes, measured by ``LiveBytes``: a TorchDispatchMode that sees every op's outputs
(forward and backward, the gradients included) and, after each op, adds up the bytes of the storages still alive
(the inputs counted from the start; the bytes an op allocates and frees inside itself are not seen). Peak minus
the inputs' bytes is what the loss adds. The process's peak RSS (``ru_maxrss``, which only rises: the chunked
loss runs first) is printed beside it as a check from outside torch. Times are one forward+backward each.
"""
import argparse
import resource
import time

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef  # torch's own weak reference to a storage
from torch.utils._python_dispatch import TorchDispatchMode  # torch's hook on every op
from torch.utils._pytree import tree_flatten

from shardtrain.tasks.criterions import CrossEntropyConfig, CrossEntropyCriterion

TARGET = 0.35
PAD = 1


class LiveBytes(TorchDispatchMode):
    """The peak, over op boundaries, of the bytes of live tensor storages (each storage counted once)."""

    def __init__(self, *inputs: torch.Tensor):
        super().__init__()
        self.storages = {}  # data_ptr -> (weak reference, bytes)
        for tensor in inputs:
            self._add(tensor)
        self.peak = self.inputs = self.live()

    def _add(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        known = self.storages.get(storage.data_ptr())
        if known is None or known[0].expired():  # a new storage (perhaps where a freed one was)
            self.storages[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())

    def live(self) -> int:
        self.storages = {ptr: entry for ptr, entry in self.storages.items() if not entry[0].expired()}
        return sum(nbytes for _, nbytes in self.storages.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self._add(tensor)
        self.peak = max(self.peak, self.live())
        return out


class Head(torch.nn.Module):
    """A model that is only its features and output weight."""

    def __init__(self, features: torch.Tensor, weight: torch.Tensor):
        super().__init__()
        self.features, self.weight = torch.nn.Parameter(features), torch.nn.Parameter(weight)

    def forward(self, src_tokens, features_only: bool = False):
        return self.features if features_only else F.linear(self.features, self.weight)

    def output_weight(self):
        return self.weight


def measure(chunks: int, vocab: int, batch: int, length: int, width: int, dtype: torch.dtype, seed: int = 0):
    """(peak live bytes above the inputs, seconds, loss) of one forward+backward of cross_entropy."""
    gen = torch.Generator().manual_seed(seed)
    head = Head(torch.randn(batch, length, width, generator=gen).to(dtype),
                (torch.randn(vocab, width, generator=gen) * width ** -0.5).to(dtype))
    target = torch.randint(0, vocab, (batch, length), generator=gen)
    sample = {"net_input": {"src_tokens": target}, "target": target, "ntokens": int(target.ne(PAD).sum())}
    task = type("Task", (), {"source_dictionary": type("Dict", (), {"pad": staticmethod(lambda: PAD)})})
    criterion = CrossEntropyCriterion(CrossEntropyConfig(loss_chunks=chunks), task)
    with LiveBytes(head.features, head.weight) as tracked:
        start = time.perf_counter()
        loss, _, _ = criterion(head, sample)
        loss.backward()
        seconds = time.perf_counter() - start
    return tracked.peak - tracked.inputs, seconds, float(loss.detach())


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--chunks", type=int, default=0, help="the chunked run's --loss-chunks (0: the rule)")
    parser.add_argument("--bf16", action="store_true", help="bf16 features and weight (default fp32)")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    sizes = (args.vocab, args.batch, args.length, args.width, dtype)
    logits_mb = args.batch * args.length * args.vocab * 4 / 2 ** 20
    print(f"vocabulary {args.vocab:,}, {args.batch} x {args.length} tokens, width {args.width}, {dtype}, "
          f"{torch.get_num_threads()} threads: fp32 logits of the batch {logits_mb:,.0f} MiB")
    for chunks in (2, 1):  # first calls pay for setting up: not timed
        measure(chunks, 64, 1, 8, 8, dtype)
    before = rss_mb()
    chunked = measure(args.chunks, *sizes)
    after_chunked = rss_mb()
    plain = measure(1, *sizes)
    after_plain = rss_mb()
    print(f"{'loss':28} {'peak above inputs MiB':>22} {'seconds':>8} {'peak RSS MiB':>13} {'summed loss':>14}")
    for name, (peak, seconds, loss), rss in ((f"chunked (--loss-chunks {args.chunks})", chunked, after_chunked),
                                            ("unchunked (--loss-chunks 1)", plain, after_plain)):
        print(f"{name:28} {peak / 2 ** 20:22,.0f} {seconds:8.2f} {rss:13,.0f} {loss:14.6g}")
    print(f"RSS before either: {before:,.0f} MiB (the RSS peak is the process's, so only the larger run shows)")
    print(f"time ratio chunked / unchunked: {chunked[1] / plain[1]:.3f}; losses differ by "
          f"{abs(chunked[2] - plain[2]) / abs(plain[2]):.2e} relative")
    print(f"RESULT chunked_loss_peak_ratio={chunked[0] / plain[0]:.3f} target<={TARGET}")


if __name__ == "__main__":
    main()
