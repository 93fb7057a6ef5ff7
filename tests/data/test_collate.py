import torch

from shardtrain.data.collate import collate, document_ids

from fakes import EOS, PAD


def sample(i, source, target):
    return {"id": i, "source": torch.tensor(source), "target": torch.tensor(target)}


def test_right_pads_source_and_target_and_counts_tokens():
    batch = collate([sample(7, [2, 10, 11], [10, 11, 2]), sample(3, [2, 12], [12, 2])], pad=PAD)
    assert batch["id"].tolist() == [7, 3]
    assert batch["id"].dtype == torch.long
    assert batch["nsentences"] == 2
    assert batch["ntokens"] == 5
    assert batch["net_input"]["src_tokens"].tolist() == [[2, 10, 11], [2, 12, 1]]
    assert batch["net_input"]["src_lengths"].tolist() == [3, 2]
    assert batch["target"].tolist() == [[10, 11, 2], [12, 2, 1]]
    assert batch["target"].dtype == torch.long
    assert batch["ntokens"] == int(batch["target"].ne(PAD).sum())


def test_pad_id_is_an_argument():
    batch = collate([sample(0, [5], [6]), sample(1, [5, 5], [6, 6])], pad=0)
    assert batch["target"].tolist() == [[6, 0], [6, 6]]


def test_missing_target_means_the_source_is_the_target():
    batch = collate([{"id": 0, "source": torch.tensor([4, 5]), "target": None}], pad=PAD)
    assert batch["target"].tolist() == [[4, 5]]


def test_no_samples_give_an_empty_batch():
    assert collate([], pad=PAD) == {}


def test_a_document_starts_at_each_eos_of_the_source():
    src = torch.tensor([[5, 6, EOS, 7, EOS, EOS, 8, PAD],  # a line cut at the start, one of 2, one of 1, one cut
                        [EOS, 9, 9, 9, 9, 9, 9, 9]])  # one line filling the row
    # by hand: the tokens before the first </s> are document 0; each </s> starts the next; padding continues
    assert document_ids(src, EOS).tolist() == [[0, 0, 1, 1, 2, 3, 3, 3], [1, 1, 1, 1, 1, 1, 1, 1]]
    assert document_ids(src, EOS).dtype == torch.long
