"""RunStager's two keys: a buffer belongs to a place in the state dict (its path, list positions included), and
a copy is shared only by entries that are the same view of a storage (address, shape, stride and dtype alike).
A wrong path key shows at the second save (the first allocates a buffer per entry anyway), a wrong view key
at the first. Every expected value is written out by hand."""
import torch

from shardtrain.trainer.checkpoint.async_staging import RunStager


def _twice(state, update):
    """Stage, change the state in place (as a step), stage again: -> both staged states."""
    stager = RunStager()
    first = stager.stage(state, in_place=set())
    first = {k: v.clone() for k, v in _flat(first).items()}  # the buffers are refilled by the next stage
    update()
    return first, _flat(stager.stage(state, in_place=set())), stager


def _flat(state, path=""):
    if isinstance(state, torch.Tensor):
        return {path: state}
    items = state.items() if isinstance(state, dict) else enumerate(state)
    return {k: v for key, item in items for k, v in _flat(item, f"{path}/{key}").items()}


def test_tensors_at_list_positions_keep_their_own_buffers_and_values():
    moments = [torch.full((2, 2), 1.0), torch.full((2, 2), 2.0)]  # same shape, different values
    state = {"optimizer": {"extra": moments}, "scales": (torch.tensor([3.0, 4.0]),)}

    def step():
        moments[0].add_(10.0)
        moments[1].mul_(3.0)
    first, second, stager = _twice(state, step)
    assert torch.equal(first["/optimizer/extra/0"], torch.tensor([[1.0, 1.0], [1.0, 1.0]]))
    assert torch.equal(first["/optimizer/extra/1"], torch.tensor([[2.0, 2.0], [2.0, 2.0]]))
    assert torch.equal(second["/optimizer/extra/0"], torch.tensor([[11.0, 11.0], [11.0, 11.0]]))
    assert torch.equal(second["/optimizer/extra/1"], torch.tensor([[6.0, 6.0], [6.0, 6.0]]))
    assert torch.equal(second["/scales/0"], torch.tensor([3.0, 4.0]))
    assert sorted(stager.buffers()) == ["/optimizer/extra/0", "/optimizer/extra/1", "/scales/0"]
    assert second["/optimizer/extra/0"].data_ptr() != second["/optimizer/extra/1"].data_ptr()
    assert stager.allocations == 3  # the second save refilled the first's buffers


def test_views_of_one_storage_with_other_shapes_or_strides_are_staged_apart_and_restaged():
    base = torch.arange(12.0)
    state = {"rows": base.view(4, 3), "cols": base.view(3, 4), "turned": base.view(4, 3).t(),
             "head": base[:6].view(2, 3), "short": base[:3].view(1, 3), "tied": base.view(4, 3)}
    first, second, stager = _twice(state, lambda: base.add_(100.0))
    rows = torch.tensor([[0.0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]])
    want = {"/rows": rows, "/cols": torch.tensor([[0.0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]),
            "/turned": torch.tensor([[0.0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]),  # (3, 4) as cols, strides not
            "/head": torch.tensor([[0.0, 1, 2], [3, 4, 5]]), "/short": torch.tensor([[0.0, 1, 2]]),  # one stride
            "/tied": rows}
    for path, values in want.items():
        assert first[path].shape == values.shape and torch.equal(first[path], values), path
        assert torch.equal(second[path], values + 100.0), path  # the second save holds the update
    assert second["/tied"] is second["/rows"]  # the same view twice (tied weights): one copy
    assert stager.allocations == 5 and len(stager.buffers()) == 5


def test_entries_whose_paths_read_alike_keep_their_own_buffers():
    """'a/b' at the top and 'b' inside 'a' spell one path; 0 and '0' too."""
    state = {"a/b": torch.full((2,), 1.0), "a": {"b": torch.full((2,), 2.0)}, 0: torch.full((2,), 3.0),
             "0": torch.full((2,), 4.0)}

    def step():
        for i, t in enumerate((state["a/b"], state["a"]["b"], state[0], state["0"])):
            t.add_(10.0 * (i + 1))
    stager = RunStager()
    stager.stage(state, in_place=set())
    step()
    staged = stager.stage(state, in_place=set())
    assert torch.equal(staged["a/b"], torch.tensor([11.0, 11.0]))
    assert torch.equal(staged["a"]["b"], torch.tensor([22.0, 22.0]))
    assert torch.equal(staged[0], torch.tensor([33.0, 33.0]))
    assert torch.equal(staged["0"], torch.tensor([44.0, 44.0]))
    assert stager.allocations == 4 and len(stager.buffers()) == 4
