"""A pickle payload torch's weights-only loader refuses is reported as a refused payload (what it would have
called, and that nothing ran), never as a missing or damaged file: also a builtin (torch names it without its
module) and a protocol-0 payload torch stops reading before it names the call."""
import io
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

from shardtrain.cli import consolidate
from shardtrain.core.errors import CheckpointError
from shardtrain.trainer.checkpoint.safe_loading import load_weights_only
from st_testutils import cli_refusal


class Eval:
    """Unpickles as ``eval(code)``."""

    def __init__(self, code):
        self.code = code

    def __reduce__(self):
        return eval, (self.code,)


def test_a_builtin_in_a_shards_value_is_a_refused_payload(tmp_path, capsys):
    ran = tmp_path / "ran"
    code = f"__import__('os').mkdir({str(ran)!r})"
    pickle.loads(pickle.dumps(Eval(code)))  # live: plain unpickling runs it
    assert ran.is_dir()
    ran.rmdir()
    ck = tmp_path / "ck"  # written before checksums (none to forge): the reader's own refusal is tested
    dcp.save({"model": {"w": torch.ones(3)}, "optimizer": {"param_groups": [{"lr": Eval(code)}]}},
             checkpoint_id=str(ck), no_dist=True)
    torch.save({"cfg": {}}, ck / "extra.pt")
    (ck / "COMPLETE").write_text("{}")
    capsys.readouterr()  # DCP's warning when it saves without a process group (once a process): not the refusal
    err = cli_refusal(consolidate.main, [str(ck), str(tmp_path / "out.pt")], capsys)[1]
    assert "'optimizer.param_groups.0.lr'" in err and "contains a pickled builtins.eval" in err, err
    assert "nothing in it was run" in err and "missing or damaged" not in err, err
    assert not ran.exists() and not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("blob, named", [
    (b"(S'touch x'\nios\nsystem\n.", "os.system"),  # protocol 0 INST: torch stops at the string opcode first
    (b"\x80\x02cbuiltins\nexec\nX\x01\x00\x00\x001\x85R.", "builtins.exec"),
])
def test_payloads_torch_stops_early_are_named(blob, named):
    with pytest.raises(CheckpointError) as info:
        load_weights_only(io.BytesIO(blob), "the value 'x'")
    assert f"the value 'x' contains a pickled {named}, which is not tensor data" in str(info.value)


def test_damaged_bytes_are_no_payload():
    with pytest.raises(pickle.UnpicklingError):  # the caller calls that damaged
        load_weights_only(io.BytesIO(b"\x80\x02K\x01\xff\xfe"), "the value 'x'")
