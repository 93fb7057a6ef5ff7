"""benchmarks/chunked_loss.py: its live-bytes tracker counts what is alive, by hand, and a small run prints the
RESULT line with each loss's peak what it must be: unchunked, the logits, their log-probabilities and their gradient
at once; chunked, one chunk's logits beside the two gradients (the chunk before is freed first)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import chunked_loss  # noqa: E402
from chunked_loss import LiveBytes, measure  # noqa: E402


def test_live_bytes_counts_each_live_storage_once():
    given = torch.zeros(250)  # 1,000 bytes, alive before the mode starts
    with LiveBytes(given) as tracked:
        a = torch.ones(1000)  # 4,000
        b = a * 2  # 4,000 more
        a.add_(1)  # in place: nothing new
        view = a[:10]  # a view of a's storage: nothing new
        del a, b
        c = torch.ones(500)  # 2,000: a and b are gone, but view keeps a's storage
        assert tracked.live() == 1000 + 4000 + 2000
    assert tracked.inputs == 1000 and tracked.peak == 1000 + 8000
    del view, c


def test_a_small_run_and_its_result_line(monkeypatch, capsys):
    vocab, batch, length, width = 1000, 2, 32, 4  # a chunk's logits (64 KB) 4x the weight's gradient
    logits = batch * length * vocab * 4
    plain, _, plain_loss = measure(1, vocab, batch, length, width, torch.float32)
    assert plain >= 3 * logits  # logits, log-probabilities and the logits' gradient, all alive in backward
    chunked, _, chunked_loss_value = measure(4, vocab, batch, length, width, torch.float32)
    gradients = (vocab + batch * length) * width * 4
    assert logits // 4 + gradients <= chunked <= logits // 4 + gradients + 2048  # + a few rows' logsumexp, masks
    assert abs(chunked_loss_value - plain_loss) <= 1e-6 * abs(plain_loss)
    monkeypatch.setattr(sys, "argv", ["chunked_loss.py", "--vocab", str(vocab), "--batch", str(batch), "--length",
                                      str(length), "--width", str(width), "--chunks", "4"])
    chunked_loss.main()
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"RESULT chunked_loss_peak_ratio={chunked / plain:.3f} target<=0.35", last
