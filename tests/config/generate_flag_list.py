"""Write fairseq 0.12.2's flag list (fairseq_0_12_2_flags.json) from its source, without importing fairseq.

    python tests/config/generate_flag_list.py [--mirror GIT_DIR] [--out FILE]

Reads the files from the git mirror (``git show v0.12.2:PATH``), parses each group's config
dataclass with ``ast`` (or, for the optimizers that still use ``add_args``, its
``parser.add_argument`` calls) and names the flags as fairseq/dataclass/utils.py's
gen_parser_from_dataclass does: ``--`` + the field name with ``-`` for ``_``, the
``argparse_alias`` as a second name, ``_name`` skipped, ``data`` positional, a field whose
default is an ``II(...)`` interpolation skipped when it has no help (another group adds it),
otherwise kept with no default. Booleans are store_true (store_false when the default is True),
except that a field with an interpolated default takes one value whatever its type (fairseq adds no
action for it: ``--update-epoch-batch-itr True``); an ``argparse_const`` makes the value optional.
"""
import argparse
import ast
import json
import os
import re
import subprocess
import sys
from typing import Any, Dict, List, Optional

TAG = "v0.12.2"
DEFAULT_MIRROR = "/work/.mirror/facebookresearch+fairseq/repo"
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "fairseq_0_12_2_flags.json")

CONFIGS = "fairseq/dataclass/configs.py"
# group -> (file, dataclass name, or None for a legacy ``add_args``)
GROUPS = {
    "common": (CONFIGS, "CommonConfig"),
    "distributed_training": (CONFIGS, "DistributedTrainingConfig"),
    "dataset": (CONFIGS, "DatasetConfig"),
    "optimization": (CONFIGS, "OptimizationConfig"),
    "checkpoint": (CONFIGS, "CheckpointConfig"),
    "task:language_modeling": ("fairseq/tasks/language_modeling.py", "LanguageModelingConfig"),
    "model:transformer_lm": ("fairseq/models/transformer_lm.py", "TransformerLanguageModelConfig"),
    "optimizer:adam": ("fairseq/optim/adam.py", "FairseqAdamConfig"),
    "optimizer:adafactor": ("fairseq/optim/adafactor.py", None),
    "optimizer:sgd": ("fairseq/optim/sgd.py", None),
    "optimizer:nag": ("fairseq/optim/nag.py", "FairseqNAGConfig"),
    "optimizer:adagrad": ("fairseq/optim/adagrad.py", None),
    "optimizer:cpu_adam": ("fairseq/optim/cpu_adam.py", "FairseqCPUAdamConfig"),
    "lr_scheduler:fixed": ("fairseq/optim/lr_scheduler/fixed_schedule.py", "FixedLRScheduleConfig"),
    "lr_scheduler:inverse_sqrt": ("fairseq/optim/lr_scheduler/inverse_square_root_schedule.py",
                                  "InverseSquareRootLRScheduleConfig"),
    "lr_scheduler:polynomial_decay": ("fairseq/optim/lr_scheduler/polynomial_decay_schedule.py",
                                      "PolynomialDecayLRScheduleConfig"),
    "lr_scheduler:cosine": ("fairseq/optim/lr_scheduler/cosine_lr_scheduler.py", "CosineLRScheduleConfig"),
    "lr_scheduler:tri_stage": ("fairseq/optim/lr_scheduler/tri_stage_lr_scheduler.py", "TriStageLRScheduleConfig"),
    "lr_scheduler:reduce_lr_on_plateau": ("fairseq/optim/lr_scheduler/reduce_lr_on_plateau.py",
                                          "ReduceLROnPlateauLRScheduleConfig"),
}
# fairseq's get_parser adds one flag per registry set up by these files (--criterion, --bpe, ...), after common's.
REGISTRY_FILES = ("fairseq/criterions/__init__.py", "fairseq/data/encoders/__init__.py", "fairseq/optim/__init__.py",
                  "fairseq/optim/lr_scheduler/__init__.py", "fairseq/scoring/__init__.py")


class Source:
    """fairseq's files at TAG, parsed once each."""

    def __init__(self, mirror: str):
        self.mirror = mirror
        self.trees: Dict[str, Optional[ast.Module]] = {}

    def tree(self, path: str) -> Optional[ast.Module]:
        if path not in self.trees:
            run = subprocess.run(["git", "--git-dir", self.mirror, "show", f"{TAG}:{path}"],
                                 capture_output=True, text=True)
            self.trees[path] = ast.parse(run.stdout) if run.returncode == 0 else None
        return self.trees[path]

    def constant(self, path: str, name: str, depth: int = 0) -> Any:
        """The value of module-level ``name`` in ``path``, following ``from fairseq.x import name``."""
        tree = self.tree(path)
        if tree is None or depth > 4:
            raise ValueError(name)
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
                return evaluate(node.value, self, path)
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
                base = _module_path(path, node)
                if base is not None:
                    for candidate in (base + ".py", base + "/__init__.py"):
                        if self.tree(candidate) is not None:
                            return self.constant(candidate, name, depth + 1)
        raise ValueError(name)


def _module_path(path: str, node: ast.ImportFrom) -> Optional[str]:
    """``fairseq/x/y`` for ``from fairseq.x.y import`` or a relative import inside fairseq."""
    if node.level:
        parts = path.split("/")[:-node.level] + (node.module.split(".") if node.module else [])
        return "/".join(parts)
    return node.module.replace(".", "/") if node.module and node.module.startswith("fairseq") else None


def evaluate(node: ast.AST, source: Source, path: str) -> Any:
    """A literal, a module constant, ``int(1e8)``, ``ChoiceEnum([...])``; ValueError otherwise."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, ast.Name):
        return source.constant(path, node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1:
        inner = evaluate(node.args[0], source, path)
        if node.func.id in ("int", "float", "str"):
            return {"int": int, "float": float, "str": str}[node.func.id](inner)
        if node.func.id == "ChoiceEnum":
            return {"choices": list(inner)}
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.Mult)):
        left, right = evaluate(node.left, source, path), evaluate(node.right, source, path)
        return left ** right if isinstance(node.op, ast.Pow) else left * right
    if isinstance(node, ast.Lambda):
        return evaluate(node.body, source, path)
    raise ValueError(ast.unparse(node))


def value_or_text(node: ast.AST, source: Source, path: str) -> Any:
    try:
        value = evaluate(node, source, path)
        json.dumps(value)
        return value
    except (ValueError, TypeError):
        return ast.unparse(node)


def interpolation(node: Optional[ast.AST]) -> Optional[str]:
    """``"${task.x}"`` for ``II("task.x")``, else None."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "II" and node.args:
        return "${" + ast.literal_eval(node.args[0]) + "}"
    return None


def _keywords(call: ast.Call) -> Dict[str, ast.AST]:
    return {k.arg: k.value for k in call.keywords}


def _choices(annotation: ast.AST, source: Source, path: str) -> Optional[List[str]]:
    """Choices of a ChoiceEnum annotation (``Optional[X]`` unwrapped), when they are literal."""
    if isinstance(annotation, ast.Subscript) and getattr(annotation.value, "id", None) == "Optional":
        annotation = annotation.slice
    try:
        value = evaluate(annotation, source, path)
    except (ValueError, TypeError):
        return None
    return value["choices"] if isinstance(value, dict) else None


def dataclass_flags(source: Source, path: str, class_name: str) -> List[Dict]:
    tree = source.tree(path)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    out = []
    for stmt in cls.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        name, meta, default = stmt.target.id, {}, None
        if name == "_name":
            continue
        value = stmt.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
            kw = _keywords(value)
            if "metadata" in kw:
                meta = {k.value: v for k, v in zip(kw["metadata"].keys, kw["metadata"].values)}
            default = kw.get("default", kw.get("default_factory"))
        else:
            default = value
        help_text = value_or_text(meta["help"], source, path) if "help" in meta else None
        interp = interpolation(default)
        if interp is not None and help_text is None:
            continue  # fairseq adds this flag from the group that owns it
        type_text = ast.unparse(stmt.annotation)
        entry = {"flags": [name if name == "data" else "--" + name.replace("_", "-")], "field": name,
                 "type": type_text, "help": help_text}
        if "argparse_alias" in meta:
            entry["flags"].append(ast.literal_eval(meta["argparse_alias"]))
        if interp is not None:
            entry["default"] = interp
        elif default is None:
            entry["required"] = True
            entry["default"] = None
        else:
            entry["default"] = value_or_text(default, source, path)
        entry["arity"] = _arity(name, type_text, entry["default"], "argparse_const" in meta)
        if "argparse_const" in meta:
            entry["const"] = ast.literal_eval(meta["argparse_const"])
        choices = _choices(stmt.annotation, source, path)
        if choices:
            entry["choices"] = choices
        out.append(entry)
    return out


def _arity(name: str, type_text: str, default: Any, has_const: bool) -> str:
    """"store_true" / "store_false" (no value), "?" (optional value), "1" (one value), "positional"."""
    if name == "data":
        return "positional"
    if isinstance(default, str) and default.startswith("${"):
        return "1"  # gen_parser_from_dataclass gives an interpolated default no action, so the flag takes a value
    if type_text in ("bool", "Optional[bool]"):
        return "store_false" if default is True else "store_true"
    return "?" if has_const else "1"


def add_args_flags(source: Source, path: str) -> List[Dict]:
    """The ``parser.add_argument`` calls of a legacy ``add_args``."""
    tree = source.tree(path)
    add_args = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "add_args")
    out = []
    for call in ast.walk(add_args):
        if not (isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "add_argument"):
            continue
        names = [ast.literal_eval(a) for a in call.args]
        kw = _keywords(call)
        action = ast.literal_eval(kw["action"]) if "action" in kw else None
        default = value_or_text(kw["default"], source, path) if "default" in kw else (
            False if action == "store_true" else None)
        out.append({"flags": names, "field": names[0][2:].replace("-", "_"),
                    "type": ast.unparse(kw["type"]) if "type" in kw else ("bool" if action else "str"),
                    "help": value_or_text(kw["help"], source, path) if "help" in kw else None,
                    "default": default, "arity": action or "1"})
    return sorted(out, key=lambda e: call_order(e, add_args))


def registry_flags(source: Source) -> List[Dict]:
    """The ``--NAME`` of each ``registry.setup_registry("--NAME", default=...)``, with the names its decorator
    (the second name the call is assigned to) registers in fairseq/ as choices."""
    out = []
    for path in REGISTRY_FILES:
        for node in ast.walk(source.tree(path)):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                    and getattr(node.value.func, "attr", None) == "setup_registry"):
                continue
            kw = _keywords(node.value)
            name = ast.literal_eval(node.value.args[0])
            default = ast.literal_eval(kw["default"]) if "default" in kw else None
            out.append({"flags": [name], "field": name[2:].replace("-", "_"), "type": "Optional[str]", "help": None,
                        "default": default, "arity": "1",
                        "choices": registered_names(source, node.targets[0].elts[1].id)})
    return out


def registered_names(source: Source, decorator: str) -> List[str]:
    run = subprocess.run(["git", "--git-dir", source.mirror, "grep", "-h", "-A2", f"@{decorator}(", TAG, "--",
                          "fairseq"], capture_output=True, text=True, check=True)
    return sorted(set(re.findall(rf"@{decorator}\(\s*[\"']([^\"']+)[\"']", run.stdout)))


def call_order(entry: Dict, fn: ast.FunctionDef) -> int:
    for call in ast.walk(fn):
        if isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant):
            if call.args[0].value == entry["flags"][0]:
                return call.lineno
    return 0


def architectures(source: Source, path: str, model: str) -> List[str]:
    names = []
    for node in ast.walk(source.tree(path)):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                if (isinstance(dec, ast.Call) and getattr(dec.func, "id", None) == "register_model_architecture"
                        and ast.literal_eval(dec.args[0]) == model):
                    names.append(ast.literal_eval(dec.args[1]))
    return names


def generate(mirror: str) -> Dict:
    source = Source(mirror)
    groups = {}
    for group, (path, class_name) in GROUPS.items():
        if source.tree(path) is None:
            raise SystemExit(f"{TAG}:{path} is not in the git mirror {mirror}")
        flags = dataclass_flags(source, path, class_name) if class_name else add_args_flags(source, path)
        groups[group] = {"source": path, "flags": flags}
        if group == "common":
            groups["registries"] = {"source": "fairseq/options.py", "flags": registry_flags(source)}
    groups["model:transformer_lm"]["architectures"] = architectures(
        source, "fairseq/models/transformer_lm.py", "transformer_lm")
    return {"fairseq": TAG, "generated_by": "tests/config/generate_flag_list.py", "groups": groups}


def dump(data: Dict) -> str:
    return json.dumps(data, indent=1, sort_keys=False) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", default=os.environ.get("FAIRSEQ_MIRROR", DEFAULT_MIRROR))
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    with open(args.out, "w") as f:
        f.write(dump(generate(args.mirror)))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
