"""The largest ``transformer_lm_gpt3_*`` that trains on this machine, and its RAM per parameter.

fairseq's FSDP guide trains a 13B model on one GPU with ``--ddp-backend
fully_sharded --cpu-offload --optimizer cpu_adam --checkpoint-activations``,
needing ~256 GB of host RAM: ~19.5 bytes per parameter. Here the same recipe
(``--bf16`` compute, as CPUs have no fast fp16) runs on 2 CPU ranks through
the real CLI (``shard-train``), for 3 updates of one 512-token sequence per
rank, with a GPT-2-sized vocabulary (50,000 symbols, as the guide's data).

Search: for each kind of Adam moments, fp32 (the default, as fairseq's guide
runs) and fp16 (``--fp16-adam-stats``, 4 bytes per parameter less), the
architectures from the largest down; the first one that completes 3 updates
is that kind's answer. One is skipped without running when the state it must
hold (fp32 parameters and gradients, plus Adam's two moments) cannot fit in
the memory available; otherwise it runs under a watchdog that samples the
resident memory of the whole process tree every 0.1 s and stops it before the
machine runs out. Both answers are reported side by side; the RESULT lines
without a suffix are the larger of the two.

RAM per parameter = peak resident memory of the whole job (both ranks and
the launcher, sampled together, so Python and torch themselves are included)
/ parameters.

    python benchmarks/largest_model.py [--archs transformer_lm_gpt3_xl,...] [--moments fp32,fp16]
                                       [--headroom-gb 0.8] [--keep-log DIR]
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_data import random_data_bin  # noqa: E402

ARCHS = ["transformer_lm_gpt3_2_7", "transformer_lm_gpt3_xl", "transformer_lm_gpt3_large",
         "transformer_lm_gpt3_medium", "transformer_lm_gpt3_small"]
VOCAB = 50_000
FAIRSEQ_BYTES_PER_PARAM = 256e9 / 13e9  # the guide: 13B parameters on a 256 GB host (~19.7)


def count_params(data_bin: str, arch: str) -> int:
    """Parameters of ``arch`` on this dictionary, built on the meta device (no memory)."""
    from shardtrain.config.run_config import parse_train_args
    from shardtrain.trainer.resolved import Components, build_model, build_task
    cfg = parse_train_args([data_bin, "--arch", arch, "--tokens-per-sample", "512"])
    with torch.device("meta"):
        components = Components.of(cfg)
        model = build_model(cfg, components, build_task(cfg, components))
    return sum(p.numel() for p in model.parameters())


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return info["MemAvailable"]


def tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (from /proc)."""
    children, rss = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/statm") as f:
                rss[int(entry)] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def run_one(data_bin: str, arch: str, fp16_stats: bool, limit: int, log_path: str):
    """Train 3 updates; return (completed, peak bytes, seconds, reason)."""
    cmd = ["shard-train", data_bin, "--task", "language_modeling", "--arch", arch,
           "--ddp-backend", "fully_sharded", "--distributed-world-size", "2", "--cpu",
           "--bf16", "--cpu-offload", "--optimizer", "cpu_adam", "--checkpoint-activations",
           "--tokens-per-sample", "512", "--batch-size", "1", "--max-update", "3", "--lr", "1e-4",
           "--no-save", "--disable-validation", "--log-format", "json", "--log-interval", "1",
           "--save-dir", os.path.join(os.path.dirname(log_path), "unused")]
    if fp16_stats:
        cmd.append("--fp16-adam-stats")
    start, peak, killed = time.time(), 0, []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def watch():
            nonlocal peak
            while proc.poll() is None:
                used = tree_rss(proc.pid)
                peak = max(peak, used)
                if used > limit:
                    killed.append(used)
                    os.killpg(proc.pid, signal.SIGKILL)
                    return
                time.sleep(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        proc.wait()
        watcher.join()
    seconds = time.time() - start
    if killed:
        return False, peak, seconds, f"stopped at {killed[0] / 1e9:.1f} GB resident (limit {limit / 1e9:.1f} GB)"
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-2000:]
        return False, peak, seconds, f"exit {proc.returncode}:\n{tail}"
    return True, peak, seconds, "3 updates"


def largest(data_bin: str, archs, fp16_stats: bool, limit: int, logs: str):
    """The first of ``archs`` (largest first) that trains 3 updates with these moments: (arch, params, peak)."""
    moments = "fp16" if fp16_stats else "fp32"
    for arch in archs:
        params = count_params(data_bin, arch)
        floor = params * (4 + 4 + (4 if fp16_stats else 8))  # param + grad + two moments, all sharded
        if floor > limit:
            print(f"{arch:28s} {params / 1e9:7.2f}B {moments:>12s} {'-':>9s} {'-':>8s} {'-':>6s}  skipped: "
                  f"its state alone needs {floor / 1e9:.1f} GB")
            continue
        ok, peak, seconds, reason = run_one(data_bin, arch, fp16_stats, limit,
                                            os.path.join(logs, f"{arch}-{moments}.log"))
        print(f"{arch:28s} {params / 1e9:7.2f}B {moments:>12s} {peak / 1e9:8.1f}G {peak / params:8.1f} "
              f"{seconds:5.0f}s  {reason}", flush=True)
        if ok:
            return arch, params, peak
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--archs", default=",".join(ARCHS), help="candidates, largest first")
    parser.add_argument("--moments", default="fp32,fp16", help="Adam moment kinds to search: fp32, fp16 or both")
    parser.add_argument("--headroom-gb", type=float, default=0.8,
                        help="memory left to the rest of the machine when the watchdog stops a run")
    parser.add_argument("--keep-log", default=None, help="directory to keep the runs' logs in")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="largest-")
    logs = args.keep_log or work
    os.makedirs(logs, exist_ok=True)
    data_bin = random_data_bin(os.path.join(work, "data-bin"), vocab=VOCAB, lines=40, line_len=1100)
    limit = available_bytes() - int(args.headroom_gb * 1e9)
    print(f"memory available to the job: {limit / 1e9:.1f} GB (MemAvailable minus {args.headroom_gb} GB)")
    print(f"{'arch':28s} {'params':>8s} {'adam moments':>12s} {'peak RSS':>9s} {'B/param':>8s} {'time':>6s}  result")
    found = {moments: largest(data_bin, args.archs.split(","), moments == "fp16", limit, logs)
             for moments in args.moments.split(",")}
    for moments, answer in found.items():
        if answer is None:
            print(f"{moments} Adam moments: nothing fits")
            continue
        arch, params, peak = answer
        per_param = peak / params
        print(f"largest with {moments} Adam moments: {arch}, {params / 1e9:.2f}B parameters, peak resident "
              f"{peak / 1e9:.1f} GB, {per_param:.1f} bytes/parameter = {per_param / FAIRSEQ_BYTES_PER_PARAM:.2f}x "
              f"fairseq's guide ({FAIRSEQ_BYTES_PER_PARAM:.1f})")
        print(f"RESULT ram_bytes_per_param_{moments}_moments={per_param:.1f} target<=18")
        print(f"RESULT largest_params_billion_{moments}_moments={params / 1e9:.2f} target>=1.3")
    answers = [a for a in found.values() if a is not None]
    if not answers:
        print("RESULT ram_bytes_per_param=inf target<=18")
        print("RESULT largest_params_billion=0 target>=1.3")
        sys.exit(1)
    arch, params, peak = max(answers, key=lambda a: (a[1], -a[2]))  # the larger model; then the smaller peak
    print(f"RESULT ram_bytes_per_param={peak / params:.1f} target<=18")
    print(f"RESULT largest_params_billion={params / 1e9:.2f} target>=1.3")


if __name__ == "__main__":
    main()
