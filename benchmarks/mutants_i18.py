"""Issue 18: packaging, progress, plots, early checks, the demo. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

WHEEL = "tests/packaging/test_wheel.py::"
HYDRA = "tests/cli/test_hydra_train.py::"

MUTANTS = [
    Mutant("recipes_not_shipped", "the example configs ship in the wheel, reachable by name",
           "pyproject.toml", '"shardtrain.config" = ["recipes/*.yaml"]', '"shardtrain.config" = []',
           (WHEEL + "test_wheel_holds_the_package_its_data_and_metadata",)),
    Mutant("torch_range_unbounded", "the tested torch range is declared",
           "pyproject.toml", '"torch>=2.13,<2.14",', '"torch>=2.13",',
           (WHEEL + "test_wheel_holds_the_package_its_data_and_metadata",)),
    Mutant("builtin_config_not_found", "--config-name finds a built-in config with no --config-dir",
           "shardtrain/config/hydra_store.py",
           'if not os.path.isfile(os.path.join(cwd, name + ".yaml")) and name in builtin_config_names():',
           'if False:', (HYDRA + "test_builtin_config_names_and_their_precedence",)),
    Mutant("builtin_config_shadows_users", "a config file of the user's wins over a built-in of the same name",
           "shardtrain/config/hydra_store.py",
           'if not os.path.isfile(os.path.join(cwd, name + ".yaml")) and name in builtin_config_names():',
           'if name in builtin_config_names():', (HYDRA + "test_builtin_config_names_and_their_precedence",)),
]
