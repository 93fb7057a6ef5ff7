"""Every fairseq flag docs/coming_from_fairseq.md's FSDP options table names in its fairseq column is one shard-train takes
(issue 17 found three that failed when passed)."""
import os
import re

from shardtrain.config.run_config import parse_train_command
from st_testutils import tiny_model_flags

README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                      "coming_from_fairseq.md")
VALUES = {"--ddp-backend": "fully_sharded", "--optimizer": "cpu_adam", "--zero-sharding": "os",
          "--min-params-to-wrap": "1000"}
NEEDS = {"--zero-sharding": ["--ddp-backend", "pytorch_ddp"], "--memory-efficient-fp16": ["--ddp-backend", "pytorch_ddp",
                                                                                            "--optimizer", "cpu_adam"],
         "--cpu-offload": ["--ddp-backend", "fully_sharded"], "--offload-activations": ["--ddp-backend", "fully_sharded"],
         "--no-reshard-after-forward": ["--ddp-backend", "fully_sharded"]}


def fairseq_column_flags():
    with open(README) as f:
        text = f.read()
    start = text.index("## FSDP options: fairseq, Accelerate and shardtrain")
    section = text[start:text.index("\n## ", start + 10)]
    rows = [line for line in section.splitlines() if line.startswith("| `") or line.startswith("| (")]
    return sorted({flag for row in rows for flag in re.findall(r"`(--[a-z0-9-]+)", row.split("|")[1])})


def test_every_flag_of_the_fairseq_column_is_taken(tmp_path):
    flags = fairseq_column_flags()
    assert "--use-sharded-state" in flags and len(flags) >= 10, flags
    (tmp_path / "dict.txt").write_text("a 1\nb 1\n")
    for flag in flags:
        argv = [str(tmp_path), *tiny_model_flags(), "--cpu", *NEEDS.get(flag, []), flag]
        argv += [VALUES[flag]] if flag in VALUES else []
        cfg, _ = parse_train_command(argv)  # a refusal would raise (ConfigError or argparse's SystemExit)
        assert cfg is not None, flag
