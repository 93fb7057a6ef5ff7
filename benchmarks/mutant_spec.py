"""The shape of one mutant (benchmarks/mutants.py and mutants_integrity.py list them)."""
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
