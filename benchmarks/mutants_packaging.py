"""Mutants of pyproject.toml: what the wheel ships and the torch range it accepts. Each mutant was seen to fail its
tests."""
from mutant_spec import Mutant

WHEEL = "tests/packaging/test_wheel.py::"
VENV_SITE = "tests/packaging/test_venv_site.py"

MUTANTS = [
    Mutant("recipes_not_shipped", "the example configs ship in the wheel, reachable by name",
           "pyproject.toml", '"shardtrain.config" = ["recipes/*.yaml"]', '"shardtrain.config" = []',
           (WHEEL + "test_wheel_holds_the_package_its_data_and_metadata",)),
    Mutant("torch_range_unbounded", "the tested torch range is declared",
           "pyproject.toml", '"torch>=2.11,<2.16",', '"torch>=2.11",',
           (WHEEL + "test_wheel_holds_the_package_its_data_and_metadata",)),
    # issue 37: the wheel test's venv sees the running interpreter's packages, a user's venv's included
    Mutant("wheel_venv_sees_base_only", "README's test command passes in a venv",
           "tests/packaging/venv_site.py", "    dirs = list(site.getsitepackages())",
           "    dirs = list(site.getsitepackages([sys.base_prefix]))", (VENV_SITE,)),
    Mutant("wheel_venv_no_user_site", "the wheel test's venv sees the user site too",
           "tests/packaging/venv_site.py", "        dirs.append(site.getusersitepackages())", "        pass",
           (VENV_SITE + "::test_the_pth_file_lists_the_interpreters_site_folders_and_its_user_site",)),
]
