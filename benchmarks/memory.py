"""Per-rank memory of ``--ddp-backend pytorch_ddp`` against ``fully_sharded``.

Trains the same ~110M-parameter ``transformer_lm`` for a few Adam updates on 2
CPU ranks under each backend, through the framework's own ``Run`` and
``train`` (as users run it). Each backend gets its own ``call_main``, so its
two rank processes are freshly spawned and their peaks do not carry over.
Per rank it reports:

- peak RSS (the headline): ``ru_maxrss`` of the rank process itself, which
  includes the Python/torch baseline (also shown: the peak when the rank's
  main started, i.e. after importing torch and joining the process group);
- state (secondary): parameters + gradients + optimizer state this rank holds
  (local shards), from ``shardtrain.trainer.metrics.state_memory.state_bytes`` right after
  each optimizer step (the trainer then drops the gradients), largest over
  updates. Under fully_sharded with 2 ranks it is half of DDP's by
  construction: it counts shard sizes, it does not measure memory.

The fully_sharded backend sets glibc's mmap threshold to 4 MiB in its ranks
(``return_transient_buffers_to_the_os``): by default glibc raises the
threshold up to 32 MB as large blocks are freed, after which FSDP's
short-lived buffers (each gathered block, its unsharded gradients) are carved
from the heap, which keeps and fragments them. So that the headline compares
the backends and not two allocator settings, each pair runs twice:

- same allocator (the RESULT line): ``MALLOC_MMAP_THRESHOLD_`` set to the
  same 4 MiB in both backends' ranks (fully_sharded's own setting is then a
  no-op);
- as shipped (secondary): no malloc variables, so pytorch_ddp runs glibc's
  default and fully_sharded its 4 MiB.

    python benchmarks/memory.py [--rows all|fsdp|ac] [--updates 3 --vocab 16000 --verbose]

Activation checkpointing rows (``--rows ac``, printed last): a 12-block
``transformer_lm`` (embed 512, FFN 2048, 8 heads, dropout 0.1) trains on
``--ac-batch-size`` x 512-token sequences through ``Run``, without
checkpointing, with ``--checkpoint-activations`` and with every 2nd block.
A small vocabulary (``--ac-vocab``) keeps the logits, which no block holds,
from hiding what happens in the blocks.

- Memory: each row in a fresh process started with
  ``MALLOC_MMAP_THRESHOLD_=131072`` (large blocks are mmapped and returned on
  free, so resident memory follows live memory). Just before the update after
  ``--ac-warmup`` (the warm-up also allocates the optimizer state) it reads its
  resident memory (``held``: parameters, optimizer state, Python/torch),
  resets the kernel's peak (``/proc/self/clear_refs``) and reads the peak
  after the update (VmHWM). ``peak - held`` is what the update itself needs:
  activations saved for backward and their gradients, temporaries, and the
  parameter gradients (which ``zero_grad(set_to_none=True)`` drops after every
  update, so they are not in ``held``). The reduction is ``peak - held``
  without checkpointing over with it; the parameter gradients count on both
  sides, so it understates the reduction of the activations alone.
- Time: one more process (default malloc) holds all three runs and steps them
  on the same batches in turn, ``--ac-rounds`` times after the warm-up, so
  load from other processes hits them alike; the overhead is the median over
  rounds of (row / no checkpointing).
"""
import argparse
import json
import logging
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_data import random_data_bin  # noqa: E402

from shardtrain.config.run_config import parse_train_args  # noqa: E402
from shardtrain.trainer.parallel.fsdp_wrap import MMAP_THRESHOLD  # noqa: E402
from shardtrain.trainer.launch.start import call_main, make_context  # noqa: E402
from shardtrain.trainer.loop import Run, train  # noqa: E402
from shardtrain.trainer.metrics.state_memory import state_bytes  # noqa: E402

BACKENDS = ("pytorch_ddp", "fully_sharded")
# glibc reads it when a process starts: set in the parent, the spawned ranks inherit it.
# The first is the headline: both backends under the threshold fully_sharded sets for itself.
SAME_ALLOCATOR = "same 4 MiB mmap threshold"
MALLOC_SETTINGS = {SAME_ALLOCATOR: str(MMAP_THRESHOLD), "as shipped": None}
FIGURES = ("baseline_kb", "peak_kb", "param_bytes", "grad_bytes", "optim_bytes")
MODEL = ["--arch", "transformer_lm", "--decoder-layers", "12", "--decoder-embed-dim", "768",
         "--decoder-ffn-embed-dim", "3072", "--decoder-attention-heads", "12"]


def peak_rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux


def train_and_measure(cfg, ctx):
    """Runs on every rank: train, then gather every rank's figures; rank 0 returns them."""
    baseline_kb = peak_rss_kb()  # torch imported, process group joined, nothing built yet
    if not cfg.common.log_file:  # quiet unless --verbose (which sets a log file)
        logging.getLogger().setLevel(logging.WARNING)
    start = time.perf_counter()
    run = Run(cfg, ctx)
    held = {}

    def record_state(optimizer, args, kwargs):
        # Right after the step, before zero_grad(set_to_none=True) drops the gradients:
        # the one moment parameters, gradients and optimizer state all exist.
        now = state_bytes(run.trainer.params, optimizer)
        if sum(now.values()) > sum(held.values()):
            held.update(now)

    run.trainer.optimizer.register_step_post_hook(record_state)
    try:
        train(run)
        # measured before the gather below, which allocates next to nothing anyway
        mine = torch.tensor([baseline_kb, peak_rss_kb(), held["param_bytes"], held["grad_bytes"],
                             held["optim_bytes"]], dtype=torch.float64)
        ranks = [torch.zeros_like(mine) for _ in range(ctx.world_size)]
        dist.all_gather(ranks, mine)
        n_params = sum(p.numel() for p in run.trainer.params)  # DTensor numel is the global size
        updates = run.trainer.num_updates
    finally:
        run.close()
    if not ctx.is_master:
        return None
    return {"params": n_params, "updates": updates, "seconds": time.perf_counter() - start,
            "ranks": [dict(zip(FIGURES, r.tolist())) for r in ranks]}


def run_backend(data: str, tmp: str, backend: str, mmap_threshold, args) -> dict:
    cfg = parse_train_args([
        data, *MODEL, "--tokens-per-sample", "128", "--batch-size", "2", "--optimizer", "adam", "--lr", "1e-4",
        "--max-update", str(args.updates), "--no-save", "--disable-validation", "--log-format", "none",
        "--cpu", "--threads", "1", "--distributed-world-size", "2", "--ddp-backend", backend,
        "--save-dir", os.path.join(tmp, "unused"),
        *(["--log-file", os.path.join(tmp, f"{backend}.log")] if args.verbose else [])])
    saved = os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
    try:
        if mmap_threshold is not None:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = mmap_threshold
        return call_main(cfg, train_and_measure)
    finally:
        os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        if saved is not None:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved


def state_total(rank: dict) -> float:
    return rank["param_bytes"] + rank["grad_bytes"] + rank["optim_bytes"]


def largest(result: dict, key) -> float:
    """The largest figure over ranks: memory is provisioned for the fullest rank."""
    return max(key(r) for r in result["ranks"])


def print_table(results: dict) -> None:
    mb = 2 ** 20
    print(f"{'malloc':26} {'backend':14} {'rank':>4} {'params MB':>10} {'grads MB':>9} {'optim MB':>9} "
          f"{'state MB':>9} {'B/param':>8} {'start RSS MB':>13} {'peak RSS MB':>12} {'main s':>7}")
    for (malloc, backend), result in results.items():
        for i, r in enumerate(result["ranks"]):
            print(f"{malloc:26} {backend:14} {i:>4} {r['param_bytes'] / mb:>10.0f} {r['grad_bytes'] / mb:>9.0f} "
                  f"{r['optim_bytes'] / mb:>9.0f} {state_total(r) / mb:>9.0f} "
                  f"{state_total(r) / result['params']:>8.1f} {r['baseline_kb'] / 1024:>13.0f} "
                  f"{r['peak_kb'] / 1024:>12.0f} {result['seconds']:>7.1f}")


def ratios(ddp: dict, fsdp: dict):
    """fully_sharded / pytorch_ddp: (state, peak RSS, peak RSS above the start-of-main baseline)."""
    state = largest(fsdp, state_total) / largest(ddp, state_total)
    rss = largest(fsdp, lambda r: r["peak_kb"]) / largest(ddp, lambda r: r["peak_kb"])
    above = (largest(fsdp, lambda r: r["peak_kb"] - r["baseline_kb"])
             / largest(ddp, lambda r: r["peak_kb"] - r["baseline_kb"]))
    return state, rss, above


def fsdp_rows(args, tmp: str) -> None:
    results = {}
    data = random_data_bin(os.path.join(tmp, "data-bin"), vocab=args.vocab, lines=200, line_len=200)
    for malloc, threshold in MALLOC_SETTINGS.items():
        for backend in BACKENDS:  # one call_main each: fresh rank processes, fresh peaks
            results[malloc, backend] = run_backend(data, tmp, backend, threshold, args)
    if args.verbose:
        for backend in BACKENDS:
            with open(os.path.join(tmp, f"{backend}.log")) as f:
                print(f.read())
    first = next(iter(results.values()))
    assert all(r["params"] == first["params"] and r["updates"] == args.updates for r in results.values())
    print(f"transformer_lm: {first['params']:,} parameters, Adam, {args.updates} updates, 2 ranks x 1 thread, "
          f"batch 2 x 128 tokens per rank; state measured right after each optimizer step (largest)")
    print_table(results)
    figures = {malloc: ratios(results[malloc, "pytorch_ddp"], results[malloc, "fully_sharded"])
               for malloc in MALLOC_SETTINGS}
    for malloc, (state, rss, above) in figures.items():
        print(f"fully_sharded / pytorch_ddp, largest rank, {malloc}: state {state:.3f}, peak RSS {rss:.3f}, "
              f"peak RSS above the start-of-main baseline {above:.3f}")
    state, rss, _ = figures[SAME_ALLOCATOR]
    print(f"fsdp_rss_ratio_as_shipped={figures['as shipped'][1]:.3f} (pytorch_ddp under glibc's default "
          "threshold, fully_sharded under its own 4 MiB)")
    print(f"fsdp_state_ratio={state:.3f} (local shard sizes: half by construction on 2 ranks)")
    print(f"RESULT fsdp_rss_ratio={rss:.3f} target<=0.70")


# -- activation checkpointing rows ---------------------------------------------------------------
AC_MODEL = ["--arch", "transformer_lm", "--decoder-layers", "12", "--decoder-embed-dim", "512",
            "--decoder-ffn-embed-dim", "2048", "--decoder-attention-heads", "8", "--tokens-per-sample", "512"]
AC_CONFIGS = {"off": [], "every block": ["--checkpoint-activations"],
              "every 2nd block": ["--checkpoint-activations", "--checkpoint-activations-every", "2"]}


def ac_run(args, name: str, updates: int) -> Run:
    logging.getLogger().setLevel(logging.WARNING)
    cfg = parse_train_args([
        args.ac_data, *AC_MODEL, *AC_CONFIGS[name], "--batch-size", str(args.ac_batch_size), "--optimizer", "adam",
        "--lr", "1e-4", "--max-update", str(updates), "--no-save", "--disable-validation", "--log-format", "none",
        "--cpu", "--threads", str(args.ac_threads), "--save-dir", os.path.join(args.ac_data, "unused")])
    return Run(cfg, make_context(0, 0, 1, use_cuda=False, backend=None))


def proc_status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE).group(1))


def ac_memory_child(args) -> dict:
    """In a fresh process: train through ``Run``/``train``, measuring memory around every update."""
    run = ac_run(args, args.ac_child, updates=args.ac_warmup + 1)
    updates, grads = [], {}
    step = run.trainer.train_step

    def measured_step(samples):
        held = proc_status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS, so VmHWM below is this update's peak (Linux >= 4.0)
        out = step(samples)
        updates.append({"held_kb": held, "peak_kb": proc_status_kb("VmHWM")})
        return out

    run.trainer.train_step = measured_step
    run.trainer.optimizer.register_step_post_hook(
        lambda optimizer, *_: grads.update(state_bytes(run.trainer.params, optimizer)))
    try:
        train(run)
    finally:
        run.close()
    last = updates[-1]  # after the warm-up, which also allocates the optimizer state
    return {"params": sum(p.numel() for p in run.trainer.params), "grad_bytes": grads["grad_bytes"],
            "held_kb": last["held_kb"], "peak_kb": last["peak_kb"], "above_kb": last["peak_kb"] - last["held_kb"]}


def ac_timing_child(args) -> dict:
    """One process, default malloc: every configuration's ``Trainer.train_step`` on the same
    batches, alternating, so that load from other processes hits them alike."""
    runs = {name: ac_run(args, name, updates=0) for name in AC_CONFIGS}
    epoch = next(iter(runs.values())).batch_iterator("train", epoch=1, shuffle=False).next_epoch_itr(shuffle=False)
    times = {name: [] for name in runs}
    for i in range(args.ac_warmup + args.ac_rounds):
        batch = next(epoch)
        for name, run in runs.items():
            start = time.perf_counter()
            run.trainer.train_step([batch])
            if i >= args.ac_warmup:
                times[name].append(time.perf_counter() - start)
    for run in runs.values():
        run.close()
    return times


def ac_child_process(data: str, args, child: str, env: dict) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--ac-child", child, "--ac-data", data,
               *(f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                 ("ac_batch_size", "ac_warmup", "ac_rounds", "ac_threads"))]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("AC_FIGURES ")]
    if done.returncode != 0 or not lines:
        sys.exit(f"activation checkpointing child {child!r} failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(lines[-1][len("AC_FIGURES "):])


def ac_rows(args, tmp: str) -> None:
    data = random_data_bin(os.path.join(tmp, "ac-data-bin"), vocab=args.ac_vocab, lines=400, line_len=300)
    # glibc reads it when a process starts: large blocks are mmapped and returned on free
    mmap_env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    memory = {name: ac_child_process(data, args, name, mmap_env) for name in AC_CONFIGS}
    times = ac_child_process(data, args, "timing", dict(os.environ))
    mb, off = 1024, memory["off"]
    print(f"\ntransformer_lm: {off['params']:,} parameters (12 blocks, embed 512, FFN 2048, vocab {args.ac_vocab}, "
          f"dropout 0.1), Adam, batch {args.ac_batch_size} x 512 tokens, 1 process x {args.ac_threads} threads; "
          f"memory: one process per row, MALLOC_MMAP_THRESHOLD_=131072, update {args.ac_warmup + 1}; time: one "
          f"process, rows alternating, {args.ac_rounds} rounds after {args.ac_warmup}, median")
    print(f"{'checkpointing':16} {'held MB':>8} {'peak MB':>8} {'peak-held MB':>13} {'of it: grads MB':>16} "
          f"{'s/update':>9}")
    for name, r in memory.items():
        print(f"{name:16} {r['held_kb'] / mb:>8.0f} {r['peak_kb'] / mb:>8.0f} {r['above_kb'] / mb:>13.0f} "
              f"{r['grad_bytes'] / 2 ** 20:>16.0f} {statistics.median(times[name]):>9.2f}")
    overhead = {}
    for name in list(AC_CONFIGS)[1:]:
        # per round: this row against "off" run right before it; the median ignores a burst of load
        rounds = [t / t_off for t, t_off in zip(times[name], times["off"])]
        overhead[name] = statistics.median(rounds)
        print(f"{name} / off: update memory (peak - held) {memory[name]['above_kb'] / off['above_kb']:.3f}, "
              f"time per update {overhead[name]:.3f} (rounds: {' '.join(f'{x:.3f}' for x in rounds)})")
    print(f"ac_time_overhead={overhead['every block']:.3f} target<=1.40")
    print(f"RESULT ac_activation_memory_reduction={off['above_kb'] / memory['every block']['above_kb']:.2f} "
          "target>=3")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", choices=("all", "fsdp", "ac"), default="all",
                        help="which rows: pytorch_ddp vs fully_sharded, activation checkpointing, or both")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=16000, help="symbols in the random data-bin")
    parser.add_argument("--verbose", action="store_true", help="print the ranks' INFO logs at the end")
    parser.add_argument("--ac-batch-size", type=int, default=4, help="sequences of 512 tokens per update")
    parser.add_argument("--ac-vocab", type=int, default=1000, help="symbols in the activation rows' data-bin")
    parser.add_argument("--ac-warmup", type=int, default=1, help="updates before the measured ones")
    parser.add_argument("--ac-rounds", type=int, default=3, help="timed updates of each row")
    parser.add_argument("--ac-threads", type=int, default=2)
    parser.add_argument("--ac-child", choices=[*AC_CONFIGS, "timing"], help=argparse.SUPPRESS)
    parser.add_argument("--ac-data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ac_child:
        figures = ac_timing_child(args) if args.ac_child == "timing" else ac_memory_child(args)
        return print("AC_FIGURES " + json.dumps(figures))
    with tempfile.TemporaryDirectory() as tmp:
        if args.rows in ("all", "fsdp"):
            fsdp_rows(args, tmp)
        if args.rows in ("all", "ac"):  # last, so its RESULT line ends the output
            ac_rows(args, tmp)


if __name__ == "__main__":
    main()
