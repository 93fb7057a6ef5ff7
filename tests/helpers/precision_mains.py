"""The precision matrix: every graph-changing ``transformer_lm`` option x every precision x every
backend trains 2 updates with a finite loss, its activations in the compute dtype.

Importable by spawned children: one 2-rank spawn runs all the pytorch_ddp and fully_sharded cases
one after the other on the same process group (each spawn costs seconds); the one-process cases
run in the test's own process. Shared by tests/trainer/precision/test_precision_matrix_cpu.py (CPU, gloo)
and tests/gpu/test_precision_matrix.py (CUDA).

What is asserted about dtypes, and why it differs by how low precision is applied:

* ``strict``: fp32 runs, fully_sharded (FSDP2's MixedPrecisionPolicy casts the parameters, not
  the buffers, and nothing else casts: an fp32 buffer or constant silently promotes what follows
  it) and --memory-efficient-fp16 (the model itself is stored in fp16). Every module's floating
  output must be in the compute dtype: blocks, norms, embeddings, dropout, the logits.
* ``autocast`` (--bf16/--fp16 with one process or pytorch_ddp): the parameters stay fp32 and
  autocast casts at matmuls, so every ``nn.Linear`` output and the logits must be in the compute
  dtype. Embeddings are never cast and CUDA's autocast runs LayerNorm in fp32, so the residual
  stream, and with it norms, dropout and block outputs, may be fp32: any module output other
  than a Linear's must be in the compute dtype or fp32.
"""
import dataclasses
import functools
import math
import os
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.parallel.choose import unwrap
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.loop import Run, train
from st_testutils import make_space_data_bin

UPDATES = 2
MODEL = ["--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
         "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
         "--batch-size", "4", "--required-batch-size-multiple", "1"]
# Options that change the graph, each varied alone from the base (sinusoidal positions, post-norm,
# untied output, no input/output projections, scaled embeddings, no checkpointing), then all at once.
IO_DIMS = ["--decoder-input-dim", "8", "--decoder-output-dim", "24"]
OPTIONS = {
    "base": [],
    "learned_pos": ["--decoder-learned-pos"],
    "no_positions": ["--no-token-positional-embeddings"],
    "layernorm_embedding": ["--layernorm-embedding"],
    "pre_norm": ["--decoder-normalize-before"],
    "pre_norm_no_final_norm": ["--decoder-normalize-before", "--no-decoder-final-norm"],
    "shared_embed": ["--share-decoder-input-output-embed"],
    "io_dims": IO_DIMS,
    "no_scale_embedding": ["--no-scale-embedding"],
    "checkpoint_activations": ["--checkpoint-activations"],
    # Sharing needs equal input and output dims (24 each, neither the embed dim).
    "everything": ["--layernorm-embedding", "--decoder-normalize-before", "--share-decoder-input-output-embed",
                   "--decoder-input-dim", "24", "--decoder-output-dim", "24", "--no-scale-embedding",
                   "--checkpoint-activations"],
    "everything_learned_pos": ["--decoder-learned-pos", "--layernorm-embedding", "--decoder-normalize-before",
                               *IO_DIMS, "--no-scale-embedding", "--checkpoint-activations"],
}
PRECISIONS = {"fp32": [], "bf16": ["--bf16"], "fp16": ["--fp16"], "memory_efficient_fp16": ["--memory-efficient-fp16"]}
COMPUTE_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                 "memory_efficient_fp16": torch.float16}


@dataclasses.dataclass(frozen=True)
class Case:
    option: str
    precision: str
    backend: str  # single_process: one process; the others are named by --ddp-backend

    @property
    def name(self) -> str:
        return f"{self.backend}/{self.precision}/{self.option}"

    @property
    def strict(self) -> bool:
        """Every activation in the compute dtype (no autocast in between): see the module docstring."""
        return self.precision in ("fp32", "memory_efficient_fp16") or self.backend == "fully_sharded"


def cases(backends) -> List[Case]:
    """Every option x every precision allowed with each backend (--memory-efficient-fp16 is
    refused with fully_sharded, which keeps fp32 shards itself)."""
    return [Case(option, precision, backend) for backend in backends for precision in PRECISIONS
            for option in OPTIONS if not (precision == "memory_efficient_fp16" and backend == "fully_sharded")]


def argv(case: Case, data_bin: str, save_dir: str, world_size: int, cuda: bool) -> List[str]:
    backend = [] if case.backend == "single_process" else ["--ddp-backend", case.backend]
    return [data_bin, *MODEL, *OPTIONS[case.option], *PRECISIONS[case.precision], *backend,
            # --memory-efficient-fp16 needs an optimizer with fp32 state for fp16 parameters; cpu_adam
            # refuses parameters sharded on CUDA, so the others use adam.
            "--optimizer", "cpu_adam" if case.precision == "memory_efficient_fp16" else "adam",
            "--lr", "1e-3", "--max-update", str(UPDATES), "--seed", "1",
            "--no-save", "--disable-validation", "--threads", "1", "--log-format", "none",
            "--save-dir", os.path.join(save_dir, case.name.replace("/", "-")),
            "--distributed-world-size", str(world_size), "--heartbeat-timeout", "60",
            *([] if cuda else ["--cpu"])]


class DtypeProbe:
    """Forward hooks on every module recording outputs whose dtype breaks the case's rule."""

    def __init__(self, model: nn.Module, case: Case):
        self.compute, self.strict = COMPUTE_DTYPE[case.precision], case.strict
        self.violations: Dict[str, str] = {}
        self.checked = {"linear": 0, "block": 0, "logits": 0}
        root = unwrap(model)
        blocks = set(root.blocks)
        self.handles = [module.register_forward_hook(self._hook(name or "<logits>", module, module in blocks))
                        for name, module in root.named_modules()]

    def _hook(self, name: str, module: nn.Module, is_block: bool):
        kind = "logits" if name == "<logits>" else "linear" if isinstance(module, nn.Linear) else (
            "block" if is_block else None)

        def hook(_module, _inputs, output):
            if not isinstance(output, torch.Tensor) or not output.is_floating_point():
                return
            if kind is not None:
                self.checked[kind] += 1
            must_be_compute = self.strict or kind in ("linear", "logits")
            allowed = {self.compute} if must_be_compute else {self.compute, torch.float32}
            if output.dtype not in allowed:
                self.violations.setdefault(name, f"{type(module).__name__} output {output.dtype}")
        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def make_data_bin(directory: str) -> str:
    """Enough 16-token blocks for 2 updates of 2 ranks, and for fp16 updates skipped on overflow."""
    return make_space_data_bin(directory, n_words=8, train_tokens=600, valid_tokens=40, line_len=40)


def run_matrix(data_bin: str, save_dir: str, backends, world_size: int, cuda: bool = False) -> Dict[str, Dict]:
    """Train every case of ``backends`` on ``world_size`` ranks (spawned once, if more than one);
    returns rank 0's ``{case name: result}``."""
    plan = [(case, argv(case, data_bin, save_dir, world_size, cuda)) for case in cases(backends)]
    return call_main(parse_train_args(plan[0][1]), functools.partial(train_cases, plan))


def assert_all_trained(results: Dict[str, Dict], backends) -> None:
    assert sorted(results) == sorted(case.name for case in cases(backends))
    found = problems(results)
    assert not found, f"{len(found)} of {len(results)} cases failed:\n" + "\n".join(found)


def train_case(case: Case, args: List[str], ctx) -> Dict:
    """Train one case; returns its losses, dtype violations, hook counts and any error."""
    result = {"losses": [], "updates": 0, "violations": {}, "checked": {}, "error": None}
    try:
        run = Run(parse_train_args(args), ctx)
    except Exception as e:  # noqa: BLE001 - recorded so that one case's failure hides no other
        result["error"] = _describe(e)
        return result
    probe = DtypeProbe(run.trainer.model, case)
    step = run.trainer.train_step

    def recording_step(samples):
        out = step(samples)
        result["losses"].append(out["logs"][0]["loss"] / max(out["sample_size"], 1.0))
        return out

    run.trainer.train_step = recording_step
    try:
        train(run)
    except Exception as e:  # noqa: BLE001 - as above; every rank fails alike (same code, same shapes)
        result["error"] = _describe(e)
    finally:
        probe.remove()
        run.close()
    result.update(updates=run.trainer.num_updates, violations=probe.violations, checked=dict(probe.checked))
    return result


def train_cases(plan: List[Tuple[Case, List[str]]], cfg, ctx) -> Optional[Dict[str, Dict]]:
    """Entry point on every rank (``functools.partial(train_cases, plan)`` for ``call_main``):
    train each case in turn on this process group; rank 0 returns ``{case name: result}``."""
    results = {case.name: train_case(case, args, ctx) for case, args in plan}
    return results if ctx.is_master else None


def problems(results: Dict[str, Dict]) -> List[str]:
    """One line per case that did not train 2 finite updates with activations in the compute dtype."""
    lines = []
    for name, r in results.items():
        if r["error"] is not None:
            lines.append(f"{name}: raised {r['error']}")
            continue
        if r["updates"] != UPDATES or not r["losses"] or not all(math.isfinite(x) for x in r["losses"]):
            lines.append(f"{name}: {r['updates']} updates, losses {r['losses']}")
        if r["violations"]:
            lines.append(f"{name}: wrong dtype at {r['violations']}")
        unseen = [kind for kind, count in r["checked"].items() if count == 0]
        if unseen:  # a probe that saw nothing would pass anything
            lines.append(f"{name}: the dtype probe saw no {unseen} output")
    return lines


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
