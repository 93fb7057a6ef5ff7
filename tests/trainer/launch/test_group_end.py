"""A run's process group ends with DTensor's sharding caches emptied (core/torch_private.end_process_group), so a
later run in the same process (a warm rank's next job, the Python API, a notebook) never meets the ended run's
device meshes: they compare equal to the new run's, and name the old run's process groups. Found in CI: a
fully_sharded resume after a run that had one group more failed with "Could not resolve the process group
registered under the name 1"."""
import pytest
import torch.distributed as dist

import launch_mains
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main, make_context
from shardtrain.trainer.loop import Run
from st_testutils import make_space_data_bin, sharding_cache_clears, tiny_model_flags


def test_a_one_process_fully_sharded_run_empties_the_caches_when_its_group_ends(tmp_path, monkeypatch):
    """The run's own path (OneRankGroup); what emptying does is test_torch_private's and the next test's."""
    cleared = sharding_cache_clears(monkeypatch)
    data = make_space_data_bin(str(tmp_path), train_tokens=400, valid_tokens=100)
    cfg = parse_train_args([data, "--cpu", "--save-dir", str(tmp_path / "ck"), "--ddp-backend", "fully_sharded",
                            *tiny_model_flags()])
    run = Run(cfg, make_context(0, 0, 1, use_cuda=False, backend=None))
    try:
        assert dist.is_initialized() and cleared == []
    finally:
        run.close()  # OneRankGroup ends the group
    assert cleared == [False]  # once, after the group had ended


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # the same two processes run both jobs: tests/helpers/warm_ranks.py
def test_a_warm_ranks_next_run_resolves_its_own_groups(tmp_path, monkeypatch):
    def run(name):
        save = tmp_path / name
        save.mkdir()
        cfg = parse_train_args([str(save), "--cpu", "--save-dir", str(save), "--distributed-world-size", "2"])
        return call_main(cfg, launch_mains.main_dtensor_op_on_a_mesh)

    monkeypatch.setenv("ST_EXTRA_GROUP", "1")
    assert run("first") == {"mesh": ["1"], "resolved": "1"}
    monkeypatch.delenv("ST_EXTRA_GROUP")
    assert run("second") == {"mesh": ["0"], "resolved": "0"}  # before: the first run's mesh, "1", unresolvable
