"""One rank's memory, estimated once: its bytes by kind and where each kind lives, for the pre-launch fit check
(``fit.py``, from a meta build of the model) and for shard-plan (``shardtrain.plan.estimate``, from a step traced on
fake tensors), so the two cannot disagree on what a run keeps or where.

Both hand ``rank_memory`` the bytes by kind at the step's peak (the fit check counts them from the parameters:
``counted_kinds``); what no trace sees is added here from the run's facts (``facts.py``): ZeRO's division of the
optimizer state, the gradients --update-freq keeps between micro-batches, the backend's own gradient copies (DDP's
buckets unless --gradient-as-bucket-view, legacy_ddp's flat all-reduce buffer), --spike-rollback's snapshot (a copy
of the parameters, buffers and optimizer state, each beside what it copies), --async-save's pinned host copy of
the state the rank keeps on its GPU, and the CPU step during backward's copies of the state it may undo
(``undo_copy_bytes``: 12 bytes a parameter under --clip-norm or fp16; a 6.7B model's 99 GiB of offloaded state
needed about 178 GiB with them, and the check let it start); the pinned allocator's rounding (``pinned.py``) comes
in as a kind. ``RankMemory.placed`` puts each kind on its device: the optimizer state (and fp32 master copies) in
host memory where the optimizer steps there (cpu_adam) or the backend offloads it (--cpu-offload), the parameter
and gradient shards too where the backend offloads, the undo copies and pinned blocks there; the rest on the GPU.
"""
import dataclasses
from typing import Dict, Mapping

from shardtrain.trainer.run_facts import RunFacts

# Kinds a snapshot (--spike-rollback, trainer/spike.py) copies; each copy lies beside its original.
SNAPSHOT_KINDS = ("params", "optimizer", "master", "buffers")
# A trace's kinds that hold a unit's whole (FSDP's gathered parameters and gradients, its collectives' buffers).
GATHERED_KINDS = ("gathered_params", "gathered_grads", "comm_buffers")


@dataclasses.dataclass
class RankMemory:
    """Bytes one rank holds at its step's peak, by kind, and where its state lives."""
    params: int
    grads: int  # all of the rank's gradients, as backward leaves them
    optimizer: int  # the optimizer's state, master copies apart
    master: int  # the fp32 master copies an optimizer keeps of low-precision parameters (0: none)
    buffers: int
    activations: int
    grads_at_peak: int  # the gradients live at the peak: a trace's, and all that --update-freq keeps
    gathered: int = 0  # FSDP's gathered parameters and gradients, its collectives' buffers (a trace's)
    temporaries: int = 0  # at the peak: logits, their gradient... (a trace's)
    extra: int = 0  # the backend's own gradient copies (DDP's buckets, legacy_ddp's flat buffer)
    runtime: int = 0  # the kernels' own buffers (plan.estimate.RUNTIME_BYTES); the fit check counts none
    bookkeeping: int = 0  # host memory of the module and tensor objects themselves (the fit check's)
    snapshots: int = 0  # --spike-rollback keeps one (trainer/spike.py); none without it
    staged: int = 0  # host memory --async-save's stager holds for the run (``staged_bytes``)
    undo: int = 0  # host: the CPU step during backward's copies of each shard's state (``undo_copy_bytes``)
    pinned: int = 0  # host: pinned blocks' rounding up to powers of two (pinned.py; given in kinds as "pinned")
    device_type: str = "cpu"
    state_on_host: bool = False  # the parameter and gradient shards (RunFacts.state_on_host)
    optimizer_on_host: bool = False  # the optimizer's state and master copies (RunFacts.optimizer_on_host)

    @property
    def state(self) -> int:
        return self.params + self.grads + self.optimizer + self.master

    @property
    def snapshot_state(self) -> int:
        """A snapshot's copy of the parameters and optimizer state (kept where they are)."""
        return self.snapshots * (self.params + self.optimizer + self.master)

    @property
    def snapshot_buffers(self) -> int:
        """A snapshot's copy of the buffers (kept where they are: on the GPU even under --cpu-offload)."""
        return self.snapshots * self.buffers

    @property
    def snapshot(self) -> int:
        return self.snapshot_state + self.snapshot_buffers

    def placed(self) -> Dict[str, int]:
        """{"host": bytes, "device": bytes} of this rank at its peak (``place``), with --async-save's host copy.
        A CPU run holds everything in host memory. Offloaded gradients are all counted: the host holds them all when
        backward ends, after the GPU's peak."""
        offloaded = self.state_on_host and self.device_type != "cpu"
        kinds = {"params": self.params, "grads": self.grads if offloaded else self.grads_at_peak, "optimizer": self.optimizer,
                 "master": self.master, "buffers": self.buffers, "activations": self.activations,
                 "gathered": self.gathered, "temporaries": self.temporaries, "extra": self.extra,
                 "runtime": self.runtime, "bookkeeping": self.bookkeeping, "undo": self.undo, "pinned": self.pinned}
        out = place(kinds, self.device_type, self.state_on_host, self.optimizer_on_host, snapshot=self.snapshots > 0)
        out["host"] += self.staged
        return out


def counted_kinds(facts: RunFacts, count: int, buffers: int, activations: int) -> Dict[str, int]:
    """The kinds ``rank_memory`` reads, counted from a model of ``count`` parameters rather than traced: each
    parameter, its gradient, optimizer state and master copy split over the ranks that shard it, all live."""
    state = facts.spec.state_bytes + facts.spec.master_bytes(facts.param_bytes)
    return {"params": count * facts.param_bytes // facts.shards, "grads": count * facts.param_bytes // facts.shards,
            "optimizer": count * state // facts.shards, "buffers": buffers, "activations": activations}


def rank_memory(facts: RunFacts, count: int, kinds: Mapping[str, int], device_type: str, runtime: int = 0,
                bookkeeping: int = 0) -> RankMemory:
    """One rank's memory in the run ``facts`` describe, on a ``device_type`` device, for a model of ``count``
    parameters. ``kinds``: its bytes by kind at the step's peak ("params", "grads" (those live then), "optimizer"
    (master copies in it, not yet divided by ZeRO), "buffers", "activations"; a trace's also "temporaries" and
    GATHERED_KINDS; "pinned": the pinned blocks' rounding, pinned.py), a traced step's (plan/trace.py) or
    ``counted_kinds``; ``runtime``: the kernels' own buffers; ``bookkeeping``: host memory of the tensor objects."""
    params, buffers = kinds["params"], kinds["buffers"]
    grads = count * facts.param_bytes // facts.shards
    master = min(kinds["optimizer"], count * facts.spec.master_bytes(facts.param_bytes) // facts.shards)
    optimizer = kinds["optimizer"] - master
    optimizer, master = optimizer // facts.zero_shards, master // facts.zero_shards  # ZeRO: the trace's is whole
    grads_at_peak = kinds["grads"]
    if facts.update_freq > 1:  # the first micro-batches' gradients stay through the last
        grads_at_peak += max(0, grads - kinds["grads"])
    gathered = sum(kinds.get(kind, 0) for kind in GATHERED_KINDS)
    temporaries = kinds.get("temporaries", 0)
    peak = params + grads_at_peak + optimizer + master + buffers + kinds["activations"] + gathered + temporaries
    extra = gradient_copy_bytes(facts, grads, params + optimizer + master + buffers + grads, peak)
    staged = staged_bytes(facts, {"params": params, "optimizer": optimizer, "master": master}, device_type)
    return RankMemory(params=params, grads=grads, optimizer=optimizer, master=master, buffers=buffers,
                      activations=kinds["activations"], grads_at_peak=grads_at_peak, gathered=gathered,
                      temporaries=temporaries, extra=extra, runtime=runtime, bookkeeping=bookkeeping,
                      snapshots=1 if facts.snapshot else 0, staged=staged, device_type=device_type,
                      undo=undo_copy_bytes(facts, count, device_type), pinned=kinds.get("pinned", 0),
                      state_on_host=facts.state_on_host, optimizer_on_host=facts.optimizer_on_host)


def undo_copy_bytes(facts: RunFacts, count: int, device_type: str) -> int:
    """Host bytes the CPU step during backward keeps until the update is decided, where it may be undone
    (RunFacts.keeps_undo_copies): a copy of each stepped shard's parameter and moments (cpu_adam.step_one's
    ``keep``: 4 + 8 bytes a parameter in fp32), all live when backward ends, beside the state they copy."""
    if not facts.keeps_undo_copies(device_type):
        return 0
    return count * (facts.param_bytes + facts.spec.state_bytes) // facts.shards


def staged_bytes(facts: RunFacts, kinds: Dict[str, int], device_type: str) -> int:
    """Host bytes --async-save's stager keeps for the whole run (allocated at the first save, pinned, refilled
    at every later one, freed when the run ends): a copy of each saved kind the rank keeps on its GPU. State in
    host memory (a CPU run's, --cpu-offload's, cpu_adam's) is written from the live tensors, never copied."""
    saved = {kind: kinds[kind] for kind in facts.staged_kinds}
    return place(saved, device_type, facts.state_on_host, facts.optimizer_on_host, snapshot=False)["device"]


def gradient_copy_bytes(facts: RunFacts, grads: int, after_backward: int, peak: int) -> int:
    """Bytes the backend's own gradient copies add to a step whose peak is ``peak``: those held through
    backward add to it; one made after backward, beside ``after_backward`` bytes then live, only as far as
    it passes the peak."""
    if facts.world_size == 1:
        return 0
    copies = facts.backend.gradient_copies(facts.distributed)
    extra = copies.during_backward * grads
    if copies.after_backward:
        extra += max(0, after_backward + copies.after_backward * grads - peak)
    return extra


def place(kinds: Dict[str, int], device_type: str, state_on_host: bool, optimizer_on_host: bool,
          snapshot: bool) -> Dict[str, int]:
    """{"host": bytes, "device": bytes} of one rank holding ``kinds`` ("params", "grads", "optimizer",
    "master", "buffers", "bookkeeping" (host memory of the tensor objects), any other kind: the compute
    device's), the parameters and gradients in host memory when ``state_on_host``, the optimizer's state
    and master copies when ``optimizer_on_host`` (RunFacts says both); with a --spike-rollback
    ``snapshot``, a copy of SNAPSHOT_KINDS beside each original. A CPU run holds everything in host memory."""
    on_host = {"bookkeeping": True, "undo": True, "pinned": True, "params": state_on_host, "grads": state_on_host,
               "optimizer": optimizer_on_host, "master": optimizer_on_host}  # the rest: the compute device's
    out = {"host": 0, "device": 0}
    for kind, size in kinds.items():
        copies = 2 if snapshot and kind in SNAPSHOT_KINDS else 1
        where = "host" if device_type == "cpu" or on_host.get(kind, False) else "device"
        out[where] += copies * size
    return out
