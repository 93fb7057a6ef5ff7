"""The shape of one mutant (benchmarks/mutants_<area>.py list them; benchmarks/mutants.py gathers them)."""
import dataclasses
from typing import Tuple

T = "shardtrain/trainer/"


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    claim: str  # the README sentence it breaks, short
    file: str
    old: str
    new: str
    tests: Tuple[str, ...]
