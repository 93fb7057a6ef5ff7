"""The command lines of fairseq 0.12.2's language-modeling guides run with only the binary renamed.

Copied from fairseq's examples/language_model/README.md (preprocess, train, eval-lm),
examples/language_model/README.adaptive_inputs.md (transformer_lm_wiki103: adaptive input and softmax, nag,
cosine, adaptive_loss) and examples/fully_sharded_data_parallel/README.md (fully_sharded, --cpu-offload,
cpu_adam), and shrunk in size only: the values of the size flags in SHRUNK, the model's widths appended, and
the adaptive cutoffs set below this corpus's vocabulary. Each runs as its console script, as a user would.
"""
import os
import shlex
import subprocess

import pytest

from st_testutils import MarkovChain, scaled, write_markov_corpus

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

PREPROCESS = """fairseq-preprocess \\
    --only-source \\
    --trainpref $TEXT/wiki.train.tokens \\
    --validpref $TEXT/wiki.valid.tokens \\
    --testpref $TEXT/wiki.test.tokens \\
    --destdir data-bin/wikitext-103 \\
    --workers 20"""
TRAIN = """fairseq-train --task language_modeling \\
  data-bin/wikitext-103 \\
  --save-dir checkpoints/transformer_wikitext-103 \\
  --arch transformer_lm --share-decoder-input-output-embed \\
  --dropout 0.1 \\
  --optimizer adam --adam-betas '(0.9, 0.98)' --weight-decay 0.01 --clip-norm 0.0 \\
  --lr 0.0005 --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-07 \\
  --tokens-per-sample 512 --sample-break-mode none \\
  --max-tokens 2048 --update-freq 16 \\
  --fp16 \\
  --max-update 50000"""
# fairseq's guide evaluates checkpoints/transformer_wiki103/, a directory its own training command never makes
EVAL = """fairseq-eval-lm data-bin/wikitext-103 \\
    --path checkpoints/transformer_wikitext-103/checkpoint_best.pt \\
    --batch-size 2 \\
    --tokens-per-sample 512 \\
    --context-window 400"""
ADAPTIVE = """fairseq-train --task language_modeling \\
    data-bin/wikitext-103 \\
    --save-dir checkpoints/transformer_wikitext-103 \\
    --arch transformer_lm_wiki103 \\
    --max-update 286000 --lr 1.0 --t-mult 2 --lr-period-updates 270000 --lr-scheduler cosine --lr-shrink 0.75 \\
    --warmup-updates 16000 --warmup-init-lr 1e-07 --stop-min-lr 1e-09 --optimizer nag --min-lr 0.0001 --clip-norm 0.1 \\
    --criterion adaptive_loss --max-tokens 3072 --update-freq 3 --tokens-per-sample 3072 --seed 1 \\
    --sample-break-mode none --skip-invalid-size-inputs-valid-test --ddp-backend=legacy_ddp"""
FSDP = """fairseq-train data-bin/wikitext-103-roberta-bpe-bin \\
    --ddp-backend fully_sharded --fp16 --fp16-init-scale 4 \\
    --cpu-offload --checkpoint-activations \\
    --task language_modeling --tokens-per-sample 2048 --batch-size 8 \\
    --arch transformer_lm_gpt3_13 \\
    --optimizer cpu_adam --adam-betas "(0.9,0.98)" \\
    --lr 0.0001 --lr-scheduler polynomial_decay --warmup-updates 5 --total-num-update 10 \\
    --max-update 10 --no-save --log-format json --log-interval 1"""

SHRUNK = {"--workers": "2", "--max-update": "3", "--tokens-per-sample": "32", "--max-tokens": "64",
          "--update-freq": "2", "--warmup-updates": "2", "--context-window": "16", "--lr-period-updates": "2",
          "--total-num-update": "3", "--batch-size": "2"}
WIDTHS = ["--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
          "--decoder-attention-heads", "2"]
CUTOFFS = ["--adaptive-input-cutoff", "4,8", "--adaptive-softmax-cutoff", "4,8", "--decoder-input-dim", "32",
           "--decoder-output-dim", "32"]


def command(text: str, rename: str, extra=()):
    argv = shlex.split(text.replace("\\\n", " "))
    assert argv[0].startswith("fairseq-")
    argv[0] = rename
    for i, arg in enumerate(argv[:-1]):
        if arg in SHRUNK:
            argv[i + 1] = SHRUNK[arg]
    return argv + list(extra)


def run(argv, cwd, env):
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=scaled(300))
    assert result.returncode == 0, (argv, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """fairseq's wikitext-103 layout: examples/language_model/wikitext-103/wiki.{train,valid,test}.tokens."""
    root = tmp_path_factory.mktemp("guide")
    text = root / "examples" / "language_model" / "wikitext-103"
    paths = write_markov_corpus(str(text), MarkovChain(n=12, seed=3), 6000, 600, line_len=40)
    os.replace(paths["train"], text / "wiki.train.tokens")
    os.replace(paths["valid"], text / "wiki.valid.tokens")
    (text / "wiki.test.tokens").write_text((text / "wiki.valid.tokens").read_text())
    env = {**os.environ, "TEXT": str(text), "OMP_NUM_THREADS": "1"}
    run(command(PREPROCESS.replace("$TEXT", str(text)), "shard-preprocess"), root, env)
    return root, env


def test_the_language_model_guide_trains_and_evaluates(workdir):
    root, env = workdir
    run(command(TRAIN, "shard-train", WIDTHS), root, env)
    assert os.path.exists(root / "checkpoints" / "transformer_wikitext-103" / "checkpoint_best.pt")
    out = run(command(EVAL, "shard-eval-lm"), root, env)
    assert "Perplexity" in out.stdout + out.stderr


def test_the_adaptive_inputs_guide_trains(workdir, tmp_path):
    root, env = workdir
    argv = command(ADAPTIVE, "shard-train", WIDTHS + CUTOFFS)
    argv[argv.index("--save-dir") + 1] = str(tmp_path / "adaptive")
    run(argv, root, env)


def test_the_fully_sharded_guide_trains(workdir):
    root, env = workdir
    os.symlink(root / "data-bin" / "wikitext-103", root / "data-bin" / "wikitext-103-roberta-bpe-bin")
    out = run(command(FSDP, "shard-train", WIDTHS), root, env)
    assert '"num_updates": "3"' in out.stdout + out.stderr
