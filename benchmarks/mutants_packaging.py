"""Mutants of pyproject.toml: what the wheel ships and the torch range it accepts. Each mutant was seen to fail its
tests."""
from mutant_spec import Mutant

WHEEL = "tests/packaging/test_wheel.py::"

MUTANTS = [
    Mutant("recipes_not_shipped", "the example configs ship in the wheel, reachable by name",
           "pyproject.toml", '"shardtrain.config" = ["recipes/*.yaml"]', '"shardtrain.config" = []',
           (WHEEL + "test_wheel_holds_the_package_its_data_and_metadata",)),
    Mutant("torch_range_unbounded", "the tested torch range is declared",
           "pyproject.toml", '"torch>=2.11,<2.16",', '"torch>=2.11",',
           (WHEEL + "test_wheel_holds_the_package_its_data_and_metadata",)),
]
