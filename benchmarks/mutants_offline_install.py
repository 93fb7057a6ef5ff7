"""Issue 28, item 2: the offline wheelhouse for a node that has its own torch. Each mutant was seen to fail
its tests."""
from mutant_spec import Mutant

W = "shardtrain/cli/wheelhouse.py"
T = "tests/packaging/test_offline_install.py::"
COMMAND = T + "test_the_node_command_line_names_its_python_and_platform_and_never_torch"
CONTENT = T + "test_the_wheelhouse_holds_shardtrain_and_what_the_node_lacks_never_torch"
INSTALL = T + "test_install_with_no_index_keeps_the_nodes_torch_and_trains"
PRUNE = T + "test_prune_drops_torch_its_cuda_libraries_and_the_excluded"
BAD = T + "test_a_bad_python_or_platform_is_refused_before_any_download"
NO_INDEX = T + "test_without_the_index_it_fails_in_one_paragraph_and_leaves_no_folder"
IN_USE = T + "test_a_folder_in_use_is_left_as_it_is"
DEST = "tests/packaging/test_wheelhouse_dest.py::"
FALLBACK = T + "test_a_node_whose_torch_disagrees_with_its_own_packages_installs_with_the_fallback"

MUTANTS = [
    Mutant("wheelhouse_takes_torch", "the wheelhouse never holds torch: the node keeps its own",
           W, "and not TORCH_STACK.match(requirement_name(r)) and requirement_name(r) not in exclude]",
           "and requirement_name(r) not in exclude]", (COMMAND,)),
    Mutant("wheelhouse_exclude_ignored", "--exclude leaves out what the node already has",
           W, "and not TORCH_STACK.match(requirement_name(r)) and requirement_name(r) not in exclude]",
           "and not TORCH_STACK.match(requirement_name(r))]", (COMMAND,)),
    Mutant("wheelhouse_takes_extras", "only the dependencies go in, not the optional extras",
           W, r'if not re.search(r";.*\bextra\s*==", r)', "if True", (COMMAND,)),
    Mutant("wheelhouse_prune_keeps_cuda", "no wheel of torch's CUDA libraries goes in",
           W, 'TORCH_STACK = re.compile(r"^(torch|triton|pytorch-triton|nvidia-.*|cuda-.*)$")',
           'TORCH_STACK = re.compile(r"^(torch|triton|pytorch-triton)$")', (PRUNE,)),
    Mutant("wheelhouse_prune_keeps_excluded", "an excluded package pulled in by another one is left out too",
           W, "if TORCH_STACK.match(name) or name in exclude or", "if TORCH_STACK.match(name) or", (PRUNE,)),
    Mutant("wheelhouse_platform_not_widened", "a manylinux_2_28 node also gets wheels built for older glibc",
           W, 'tags = [f"{kind}_{major}_{m}_{arch}" for m in range(minor, 4 if kind == "manylinux" else -1, -1)]',
           'tags = [f"{kind}_{major}_{minor}_{arch}"]', (COMMAND,)),
    Mutant("wheelhouse_platform_not_passed", "wheels are fetched for the node's platform, not this machine's",
           W, '        args += ["--platform", tag]', "        pass", (COMMAND,)),
    Mutant("wheelhouse_python_not_passed", "wheels are fetched for the node's Python",
           W, '"--python-version", version]', '"--python-version", "3.11"]', (COMMAND,)),
    Mutant("wheelhouse_source_only_not_built", "antlr4-python3-runtime, published only as source, is built here",
           W, 'if not item["download_info"]["url"].endswith(".whl"):', "if False:", (CONTENT,)),
    Mutant("wheelhouse_requirements_txt_everything", "requirements.txt lists what the wheelhouse serves, not torch",
           W, '.write_text("".join(f"{r}\\n" for r in kept))', '.write_text("".join(f"{r}\\n" for r in requirements))',
           (CONTENT,)),
    Mutant("wheelhouse_install_may_use_an_index", "the printed install command never reaches for an index",
           W, 'print(f"  python -m pip install --no-index --find-links {folder} shardtrain")',
           'print(f"  python -m pip install --find-links {folder} shardtrain")', (INSTALL,)),
    Mutant("wheelhouse_install_reinstalls", "installing from the wheelhouse keeps the node's torch",
           W, 'print(f"  python -m pip install --no-index --find-links {folder} shardtrain")',
           'print(f"  python -m pip install --no-index --ignore-installed --find-links {folder} shardtrain")',
           (INSTALL,)),
    Mutant("wheelhouse_fallback_resolves", "the fallback installs the folder's wheels without resolving the node",
           W, 'print(f"  python -m pip install --no-index --no-deps {folder}/*.whl")',
           'print(f"  python -m pip install --no-index {folder}/*.whl")', (FALLBACK,)),
    Mutant("wheelhouse_platform_unchecked", "an unknown platform string is refused in one paragraph",
           W, "    raise ShardtrainError(f\"--platform {platform!r} is not", "    return [platform]\n    raise "
           "ShardtrainError(f\"--platform {platform!r} is not", (BAD,)),
    Mutant("wheelhouse_work_folder_left", "a failed build leaves no half-filled folder behind",
           W, "        shutil.rmtree(work, ignore_errors=True)", "        pass", (NO_INDEX,)),
    Mutant("wheelhouse_dest_in_use_overwritten", "a --dest that holds files is refused, its files untouched",
           W, "if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):", "if False:", (IN_USE,)),
    Mutant("wheelhouse_read_only_dest_traceback", "a --dest under a read-only folder is one paragraph (issue 37)",
           W, "    except OSError as e:\n        where = next(", "    except ValueError as e:\n        where = next(",
           (DEST + "test_a_dest_under_a_read_only_folder_is_one_paragraph",)),
    Mutant("wheelhouse_made_parents_left", "a failed run leaves no folder it made",
           W, "                folder.rmdir()", "                pass",
           (DEST + "test_a_failed_run_removes_the_parents_it_made",)),
]
