"""README's first real run says something every few seconds and gives its plot a curve: at the default
--log-interval 100 its 300 updates printed nothing for 8-10 minutes on a loaded machine and drew 3 points."""
import shlex

from test_readme_commands import readme_blocks, readme_text


def test_the_first_real_run_logs_every_10_updates():
    lines = [line for block in readme_blocks(readme_text()) for line in block]
    (train,) = [shlex.split(line) for line in lines if line.startswith("shard-train ")]
    assert train[train.index("--max-update") + 1] == "300"
    assert train[train.index("--log-interval") + 1] == "10"  # 30 points on the plot, a line every few seconds
