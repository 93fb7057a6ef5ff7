"""Small data the tests make for themselves (nothing is downloaded), and time budgets that scale."""
import contextlib
import json
import multiprocessing
import os
import time

import numpy as np
import torch


def load_factor() -> float:
    """How much slower than an idle machine this one runs now: runnable processes per
    core (the 1-minute load average), at least 1. ``SHARDTRAIN_TEST_TIME_SCALE`` overrides."""
    if os.environ.get("SHARDTRAIN_TEST_TIME_SCALE"):
        return float(os.environ["SHARDTRAIN_TEST_TIME_SCALE"])
    return max(1.0, os.getloadavg()[0] / len(os.sched_getaffinity(0)))


def scaled(seconds: float) -> float:
    """A time budget measured on an idle machine, stretched by the load now: a test that
    claims "within N s" of something slow to start (a process, a rank) says N on an idle
    machine and still holds on a loaded one, without a guessed, everywhere-loose N."""
    return seconds * load_factor()


class MarkovChain:
    """A random order-2 Markov chain over ``n`` words, with a known entropy rate."""

    def __init__(self, n: int = 12, concentration: float = 0.3, seed: int = 0):
        rng = np.random.RandomState(seed)
        self.n = n
        self.words = [f"w{i}" for i in range(n)]
        self.probs = rng.dirichlet([concentration] * n, size=(n, n))  # [a, b] -> p(next)
        self.rng = rng

    def stationary(self) -> np.ndarray:
        """Stationary distribution over contexts (a, b), by power iteration."""
        n = self.n
        pi = np.full((n, n), 1.0 / (n * n))
        for _ in range(2000):
            new = np.einsum("ab,abc->bc", pi, self.probs)
            if np.abs(new - pi).max() < 1e-13:
                break
            pi = new
        return pi

    def entropy_rate_bits(self) -> float:
        h = -(self.probs * np.log2(np.clip(self.probs, 1e-300, None))).sum(-1)
        return float((self.stationary() * h).sum())

    def sample(self, length: int) -> list:
        a, b = 0, 1
        out = []
        cum = np.cumsum(self.probs, axis=-1)
        u = self.rng.random_sample(length)
        for i in range(length):
            c = int(np.searchsorted(cum[a, b], u[i] * cum[a, b, -1]))
            out.append(min(c, self.n - 1))
            a, b = b, out[-1]
        return out


def group_gone(pgid: int, seconds: float) -> bool:
    """Whether every process of the group ``pgid`` (a launcher and its ranks) has ended, waiting up to
    ``seconds`` (scaled by the load) for it."""
    deadline = time.time() + scaled(seconds)
    while time.time() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def write_markov_corpus(directory: str, chain: MarkovChain, train_tokens: int, valid_tokens: int,
                        line_len=400) -> dict:
    """Write train.txt/valid.txt: one continuous chain cut into lines of ``line_len``
    tokens (a list of lengths is cycled through: lines of uneven length)."""
    os.makedirs(directory, exist_ok=True)
    paths = {}
    lengths = [line_len] if isinstance(line_len, int) else list(line_len)
    for split, count in (("train", train_tokens), ("valid", valid_tokens)):
        ids = chain.sample(count)
        starts = np.cumsum([0] + [lengths[i % len(lengths)] for i in range(count)])
        lines = [" ".join(chain.words[i] for i in ids[a:b]) for a, b in zip(starts, starts[1:]) if a < count]
        paths[split] = os.path.join(directory, f"{split}.txt")
        with open(paths[split], "w") as f:
            f.write("\n".join(lines) + "\n")
    return paths


def json_records(log_file: str, tag: str) -> list:
    """The JSON records of ``tag`` ("train_inner", "valid", ...) in a --log-format json log file."""
    records = []
    with open(log_file) as f:
        for line in f:
            parts = line.rstrip("\n").split(" | ", 3)
            if len(parts) == 4 and parts[2] == tag and parts[3].startswith("{"):
                records.append({k: _number(v) for k, v in json.loads(parts[3]).items()})
    return records


def _number(value):
    """fairseq's json log writes numbers as strings ("loss": "3.21")."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def tiny_model_flags():
    return ["--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "32",
            "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2", "--tokens-per-sample", "32",
            "--batch-size", "8", "--log-format", "json", "--log-interval", "1", "--threads", "1"]



def make_space_data_bin(directory: str, n_words: int = 8, train_tokens: int = 4000, valid_tokens: int = 400,
                        line_len=40, seed: int = 0) -> str:
    """A small whitespace-tokenized data-bin of a Markov language."""
    from shardtrain.cli import preprocess

    paths = write_markov_corpus(os.path.join(directory, "text"), MarkovChain(n=n_words, seed=seed),
                                train_tokens, valid_tokens, line_len=line_len)
    dest = os.path.join(directory, "data-bin")
    preprocess.main(["--tokenizer", "space", "--trainpref", paths["train"], "--validpref", paths["valid"],
                     "--destdir", dest, "--no-progress-bar"])
    return dest


def last_checkpoint_state(save_dir) -> dict:
    """checkpoint_last's non-tensor state, in either form: a sharded directory
    (fully_sharded) or a single file."""
    import torch

    save_dir = str(save_dir)
    sharded = os.path.join(save_dir, "checkpoint_last")
    path = os.path.join(sharded, "extra.pt") if os.path.isdir(sharded) else sharded + ".pt"
    return torch.load(path, weights_only=True)


def cli_refusal(main, argv, capsys):
    """Run a CLI ``main`` that must refuse ``argv`` as a user mistake: exit status 2 and
    one ``PROG: error: ...`` line with no traceback. Returns (stdout, stderr)."""
    import pytest

    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    assert info.value.code == 2, (info.value.code, err[-2000:])
    assert ": error: " in err and "Traceback" not in err and err.count("\n") == 1, err
    return out, err


def record_losses(trainer) -> list:
    """Make ``trainer.train_step`` append each update's loss to the list returned."""
    losses = []
    step = trainer.train_step

    def recording_step(samples):
        out = step(samples)
        losses.append(out["logs"][0]["loss"] / out["sample_size"])  # unrounded, summed over ranks
        return out

    trainer.train_step = recording_step
    return losses


def _rank_with_stack_dumps(rank, fn, stacks_dir, *args):
    """``fn(rank, *args)`` in a spawned rank that writes every thread's Python stack to
    ``stacks_dir/rank<N>.txt`` when sent SIGUSR1: what a hung rank was doing, read by ``spawn_ranks``."""
    import faulthandler
    import signal
    with open(os.path.join(stacks_dir, f"rank{rank}.txt"), "w") as stacks:
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        fn(rank, *args)


def spawn_ranks(fn, args: tuple, nprocs: int = 2, timeout: float = 120.0) -> None:
    """Run ``fn(rank, *args)`` in ``nprocs`` spawned processes; fail the test (and end them) when they
    outlast ``timeout`` seconds, stretched by the machine's load (``scaled``). The failure shows where
    each rank still running was stuck (its Python stacks), so a hang seen once can be found."""
    import signal
    import tempfile

    import pytest
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="rank-stacks-") as stacks_dir:
        context = mp.start_processes(_rank_with_stack_dumps, args=(fn, stacks_dir, *args), nprocs=nprocs,
                                     join=False, start_method="spawn")
        budget = scaled(timeout)
        deadline = time.monotonic() + budget
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                stuck = [rank for rank, process in enumerate(context.processes) if process.is_alive()]
                for rank in stuck:
                    os.kill(context.processes[rank].pid, signal.SIGUSR1)
                time.sleep(2)
                for process in context.processes:
                    process.terminate()
                dumps = []
                for rank in stuck:
                    with open(os.path.join(stacks_dir, f"rank{rank}.txt")) as stacks:
                        dumps.append(f"--- rank {rank} ---\n{stacks.read() or '(no stack written)'}")
                pytest.fail(f"{nprocs} spawned ranks timed out after {budget:.0f} s; ranks still running: "
                            f"{stuck}; their stacks:\n" + "\n".join(dumps))


class TwoBlocks(torch.nn.Module):
    """Two 8x8 linear blocks with the init_weights() hook shardtrain's preparation calls: the smallest model
    that FSDP wraps as two units plus a root."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

    def init_weights(self):
        for block in self.blocks:
            block.reset_parameters()

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def shard_verify_output(path, capsys):
    """(exit status, standard output) of ``shard-verify path``."""
    from shardtrain.cli import verify as verify_cli

    try:
        verify_cli.main([str(path)])
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().out


def tiny_plan_cfg(data: str, *flags: str):
    """The parsed config of a 4-layer, 32-wide transformer_lm on ``data`` (later flags win): what the
    planner's tests estimate and trace."""
    from shardtrain.config.run_config import parse_train_args

    return parse_train_args([data, "--arch", "transformer_lm", "--decoder-layers", "4", "--decoder-embed-dim", "32",
                             "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2",
                             "--tokens-per-sample", "32", "--batch-size", "4", *flags])


BOTH_FORMS = ("pytorch_ddp", "fully_sharded")  # single-file checkpoints, and sharded directories


def small_data_bin(directory: str) -> str:
    """The 6-word data-bin the checkpoint-format tests train on (a few updates in seconds)."""
    return make_space_data_bin(directory, n_words=6, train_tokens=3000, valid_tokens=300, line_len=30, seed=3)


def train_both_forms(data_bin: str, root, *flags: str) -> dict:
    """{backend: save dir} after a tiny --cpu run under each of BOTH_FORMS, with ``flags`` appended."""
    from shardtrain.cli import train

    out = {}
    for backend in BOTH_FORMS:
        out[backend] = os.path.join(str(root), backend)
        train.main([data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", backend, "--save-dir", out[backend],
                    "--log-format", "none", *flags])
    return out


def fit_estimate(cfg, task=None, shards: int = 1, device: str = "cpu", on_host: bool = False,
                 activations: bool = False):
    """The fit check's estimate (trainer/memory/fit.estimate) of one rank of ``cfg`` with each parameter split over
    ``shards`` ranks, on a ``device`` device, its state and optimizer state in host memory when ``on_host``
    (--cpu-offload's placement); ``task``: built from ``cfg`` when None."""
    import dataclasses

    from shardtrain.trainer.run_facts import run_facts
    from shardtrain.trainer.memory.fit import estimate
    from shardtrain.trainer.resolved import Components, build_task

    components = Components.of(cfg)
    facts = dataclasses.replace(run_facts(cfg, components, 1, 1), shards=shards)
    est = estimate(cfg, components, task or build_task(cfg, components), facts, device, activations=activations)
    return dataclasses.replace(est, state_on_host=on_host, optimizer_on_host=on_host)


def _processes() -> dict:
    """{pid: (ppid, cmdline)} of every process now."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces
            with open(f"/proc/{name}/cmdline", "rb") as f:
                found[int(name)] = (ppid, f.read())
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # exited while we looked
    return found


def spawned_ranks(launcher_pid: int) -> list:
    """Pids of the launcher's rank processes: CPU ranks are the children of its forkserver (start_method.py),
    CUDA ranks its own spawn children; not its resource tracker, not the forkserver itself."""
    processes = _processes()
    servers = {pid for pid, (ppid, cmdline) in processes.items()
               if ppid == launcher_pid and b"multiprocessing.forkserver" in cmdline}
    return sorted(pid for pid, (ppid, cmdline) in processes.items()
                  if ppid in servers or (ppid == launcher_pid and b"spawn_main" in cmdline))


@contextlib.contextmanager
def forkserver_children(preload: list):
    """A forkserver context for a test module's children, preloading ``preload``; its server is stopped on the way
    out. A server left running in a pytest worker makes every later launch there spawn its ranks
    (start_method.rank_start leaves a server it did not start alone), and CI's test_start_method saw exactly that."""
    from shardtrain.trainer.launch.start_method import end_forkserver

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preload)
    try:
        yield context
    finally:
        end_forkserver()


def sharding_cache_clears(monkeypatch) -> list:
    """Spy on torch's DTensor sharding-cache clear (core/torch_private.end_process_group calls it): the list gets
    whether a process group was still up at each call."""
    import torch.distributed as dist
    import torch.distributed.tensor.debug as debug

    cleared, clear = [], debug._clear_sharding_prop_cache
    monkeypatch.setattr(debug, "_clear_sharding_prop_cache", lambda: cleared.append(dist.is_initialized()) or clear())
    return cleared
