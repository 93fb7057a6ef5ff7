"""Random initialisation that gives the same values however a parameter is sharded,
at a cost per rank that follows the rank's shard, not the parameter.

Each ``init_`` call takes one 63-bit key from the global CPU generator (so the
run's seed and the call's position in ``init_weights`` fix it). The parameter is
then drawn in blocks of whole rows along dim 0, ``BLOCK_ELEMENTS`` or so each,
block ``b`` from its own CPU generator seeded from (key, b). Block sizes depend
on the full shape only, so a rank holding rows [i, j) (FSDP2 shards dim 0, with
torch.chunk semantics) draws just the blocks overlapping them and gets the same
values as one process drawing all blocks, on any world size and device (always
drawn on the CPU, then copied).

Fan-dependent inits (xavier, kaiming) are turned into their uniform/normal bound
from the full shape, since a block's own fans would be wrong. Init functions not
recognised here fall back to drawing the full tensor (from a generator seeded
with the key) and keeping the local part.

Sharded tensors are recognised by duck typing (``to_local``/``placements``),
so model code stays free of torch.distributed imports.
"""
import math
from typing import Callable, Optional, Tuple

import torch
from torch import nn

BLOCK_ELEMENTS = 1 << 20
_MASK64 = (1 << 64) - 1


@torch.no_grad()
def init_(tensor: torch.Tensor, fn: Callable, *args, **kwargs) -> None:
    """``fn(tensor, *args, **kwargs)`` (an ``nn.init``-style in-place init), sharding-independent."""
    key = int(torch.randint(0, 1 << 62, (), dtype=torch.int64, device="cpu").item())
    if tensor.device.type == "meta":
        return
    local = tensor.to_local() if _is_sharded(tensor) else tensor
    shape, rows = tuple(tensor.shape), _local_rows(tensor)
    law = distribution(fn, shape, *args, **kwargs)
    if law is None:
        local.copy_(_local_part(_full_fallback(tensor, key, fn, *args, **kwargs), tensor))
    elif rows is None:  # sharded along another dim: the same blocks, drawn in full
        full = torch.empty(shape, dtype=local.dtype, device="cpu")
        _fill_rows(full, shape, (0, shape[0]), key, law)
        local.copy_(_local_part(full, tensor))
    else:
        _fill_rows(local, shape, rows, key, law)


def zero_row_(tensor: torch.Tensor, row: int) -> None:
    """Zero global row ``row`` of a tensor sharded (or not) along dim 0."""
    rows = _local_rows(tensor)
    if rows is None:
        raise ValueError("zero_row_ needs a tensor sharded along dim 0 only")
    local = tensor.to_local() if _is_sharded(tensor) else tensor
    if rows[0] <= row < rows[1]:
        with torch.no_grad():
            local[row - rows[0]].zero_()


def block_rows(shape: Tuple[int, ...]) -> int:
    """Rows per block: a function of the full shape only, never of the world size."""
    row_elements = math.prod(shape[1:]) if len(shape) > 1 else 1
    return max(1, BLOCK_ELEMENTS // max(row_elements, 1))


def _fill_rows(local, shape, rows, key, law) -> None:
    """Rows [start, stop) of the full tensor into ``local``, from the blocks overlapping them."""
    start, stop = rows
    if len(shape) == 0:
        local.copy_(_draw_block(law, (), local.dtype, _block_seed(key, 0)))
        return
    per_block = block_rows(shape)
    for b in range(start // per_block, -(-stop // per_block)):
        lo, hi = b * per_block, min((b + 1) * per_block, shape[0])
        block = _draw_block(law, (hi - lo,) + shape[1:], local.dtype, _block_seed(key, b))
        a, z = max(lo, start), min(hi, stop)
        local[a - start:z - start].copy_(block[a - lo:z - lo])


def _draw_block(law, shape, dtype, seed: int) -> torch.Tensor:
    """One block on its own CPU generator (module-level so tests can count draws)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    block = torch.empty(shape, dtype=dtype, device="cpu")
    kind, p, q = law
    if kind == "uniform":
        return block.uniform_(p, q, generator=generator)
    return block.normal_(p, q, generator=generator)


def _block_seed(key: int, block: int) -> int:
    # splitmix64 of (key, block): neighbouring blocks get unrelated seeds.
    z = (key + (block + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _full_fallback(tensor, key, fn, *args, **kwargs) -> torch.Tensor:
    full = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
    with torch.random.fork_rng(devices=[]):  # leave the global stream at one draw per call
        # the CPU's generator only (``full`` is on the CPU): torch.manual_seed would re-seed every GPU's
        # too, which fork_rng(devices=[]) does not restore
        torch.default_generator.manual_seed(_block_seed(key, -1))
        fn(full, *args, **kwargs)
    return full


def fans(shape: Tuple[int, ...]) -> Tuple[int, int]:
    """(fan_in, fan_out) of a weight of ``shape``, as ``torch.nn.init`` counts them."""
    if len(shape) < 2:
        raise ValueError("fans need a tensor of at least 2 dimensions")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def distribution(fn: Callable, shape, *args, **kwargs) -> Optional[Tuple[str, float, float]]:
    """``("uniform", low, high)`` or ``("normal", mean, std)`` that ``fn`` draws from on a
    full tensor of ``shape``; None for functions not recognised (or extra arguments)."""
    rule = _RULES.get(fn)
    if rule is None or kwargs.get("generator") is not None:
        return None
    try:
        return rule(shape, *args, **kwargs)
    except TypeError:
        return None


def _uniform(shape, a=0.0, b=1.0, generator=None):
    return "uniform", a, b


def _normal(shape, mean=0.0, std=1.0, generator=None):
    return "normal", mean, std


def _xavier_std(shape, gain):
    fan_in, fan_out = fans(shape)
    return gain * math.sqrt(2.0 / float(fan_in + fan_out))


def _xavier_uniform(shape, gain=1.0, generator=None):
    bound = math.sqrt(3.0) * _xavier_std(shape, gain)
    return "uniform", -bound, bound


def _xavier_normal(shape, gain=1.0, generator=None):
    return "normal", 0.0, _xavier_std(shape, gain)


def _kaiming_std(shape, a, mode, nonlinearity):
    fan_in, fan_out = fans(shape)
    fan = {"fan_in": fan_in, "fan_out": fan_out}[mode]
    return nn.init.calculate_gain(nonlinearity, a) / math.sqrt(fan)


def _kaiming_uniform(shape, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    bound = math.sqrt(3.0) * _kaiming_std(shape, a, mode, nonlinearity)
    return "uniform", -bound, bound


def _kaiming_normal(shape, a=0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    return "normal", 0.0, _kaiming_std(shape, a, mode, nonlinearity)


_RULES = {
    nn.init.uniform_: _uniform,
    nn.init.normal_: _normal,
    nn.init.xavier_uniform_: _xavier_uniform,
    nn.init.xavier_normal_: _xavier_normal,
    nn.init.kaiming_uniform_: _kaiming_uniform,
    nn.init.kaiming_normal_: _kaiming_normal,
}


def _is_sharded(tensor) -> bool:
    return hasattr(tensor, "to_local") and hasattr(tensor, "placements")


def _local_rows(tensor) -> Optional[Tuple[int, int]]:
    """[start, stop) of the global dim-0 rows this rank holds; None if sharded on another dim."""
    if tensor.dim() == 0 or not _is_sharded(tensor):
        return 0, (tensor.shape[0] if tensor.dim() else 1)
    if any(p.is_shard() and p.dim != 0 for p in tensor.placements):
        return None
    rows = _local_part(torch.arange(tensor.shape[0], device="cpu"), tensor)
    return (int(rows[0]), int(rows[-1]) + 1) if rows.numel() else (0, 0)


def _local_part(full: torch.Tensor, tensor) -> torch.Tensor:
    """The slice of ``full`` this rank holds (torch.chunk semantics, as DTensor's Shard uses)."""
    if not _is_sharded(tensor):
        return full
    mesh = tensor.device_mesh
    coordinate = mesh.get_coordinate()
    part = full
    for mesh_dim, placement in enumerate(tensor.placements):
        if placement.is_shard():
            chunks = torch.chunk(part, mesh.size(mesh_dim), dim=placement.dim)
            index = coordinate[mesh_dim]
            part = chunks[index] if index < len(chunks) else part.narrow(placement.dim, 0, 0)
    return part
