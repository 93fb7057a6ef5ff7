"""Block indices and batches compared with fairseq 0.12.2's own (compiled) outputs."""
import json
import pathlib

import numpy as np
import pytest

from shardtrain.data.batching import batch_by_size
from shardtrain.data.token_block import build_block_index

REFERENCE = json.loads((pathlib.Path(__file__).parent / "fairseq_0.12.2_reference.json").read_text())


@pytest.mark.parametrize("case", REFERENCE["token_blocks"], ids=lambda c: c["break_mode"])
def test_token_blocks_match_fairseq(case):
    slices, block_to_item = build_block_index(np.array(case["sizes"]), case["block_size"], case["break_mode"])
    assert slices.tolist() == case["slices"]
    assert block_to_item.tolist() == case["block_to_item"]


@pytest.mark.parametrize("case", REFERENCE["batch_by_size"], ids=lambda c: str(c["required_batch_size_multiple"]))
def test_batches_match_fairseq(case):
    lengths = np.array(case["lengths"])
    batches = batch_by_size(np.arange(len(lengths)), lengths, case["max_tokens"], case["max_sentences"],
                            case["required_batch_size_multiple"])
    assert [b.tolist() for b in batches] == case["batches"]
