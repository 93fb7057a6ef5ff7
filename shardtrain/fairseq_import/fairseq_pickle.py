"""Recognise and load fairseq checkpoints without running code we did not allow.

fairseq 0.12 saves its config as plain dicts, so its checkpoints load with
``torch.load(weights_only=True)`` like ours. Older ones pickle an
``argparse.Namespace`` (``args``), omegaconf containers (``cfg``) and, before
0.9, fairseq's own meter objects; torch's safe loader refuses those. Loading
them needs full unpickling, which can execute arbitrary code, so it happens
only when the user passes ``--trust-checkpoint``, and even then through
:class:`RestrictedUnpickler`: plain data types, tensors, argparse, numpy
scalars and omegaconf's containers are allowed; a ``fairseq.*`` class becomes
an inert :class:`FairseqStandIn` (fairseq need not be installed); anything else
(``os.system``, ``builtins.eval``, ...) is refused.
"""
import io
import os
import pickle
import pickletools
import re
import types
import zipfile
from typing import Dict, Set

import omegaconf
import omegaconf.base
import torch

from shardtrain.core.errors import CheckpointError

# Modules whose objects only a fairseq checkpoint (among the files we meet) pickles.
FAIRSEQ_MODULES = ("argparse", "omegaconf", "fairseq")

_BUILTIN_TYPES = {"dict", "list", "tuple", "set", "frozenset", "str", "int", "float", "bool", "bytes",
                  "bytearray", "complex", "object", "long", "unicode", "slice"}
_ALLOWED = {
    ("collections", "OrderedDict"), ("collections", "defaultdict"), ("argparse", "Namespace"),
    ("typing", "Any"), ("copyreg", "_reconstructor"),
    ("torch._utils", "_rebuild_tensor"), ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"), ("torch._utils", "_rebuild_parameter_with_state"),
    ("torch._tensor", "_rebuild_from_type_v2"), ("torch", "Size"), ("torch", "device"),
    ("numpy", "dtype"), ("numpy", "ndarray"),
    ("numpy.core.multiarray", "scalar"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"), ("numpy._core.multiarray", "_reconstruct"),
}
_OMEGACONF_MODULES = ("omegaconf", "omegaconf.base", "omegaconf.dictconfig", "omegaconf.listconfig",
                      "omegaconf.nodes")
_OMEGACONF_DATA = (omegaconf.Node, omegaconf.base.Metadata)  # ContainerMetadata subclasses Metadata
_RENAMED_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg"}  # Python 2 names in protocol-2 pickles


class FairseqStandIn:
    """An object of a fairseq class, kept as inert data: the arguments it was
    rebuilt with and its pickled state. Nothing of fairseq runs."""

    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        self.args, self.state = args, None
        return self

    def __setstate__(self, state):
        self.state = state

    @property
    def value(self):
        """An enum member's value (fairseq's ChoiceEnum options are pickled as ``Cls("value")``)."""
        return self.args[0] if len(self.args) == 1 and self.state is None else repr(self)

    def __repr__(self) -> str:
        return f"<fairseq {type(self).__name__} {self.args!r}>"


class RestrictedUnpickler(pickle.Unpickler):
    """``find_class`` from an allow-list; see the module docstring."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stand_ins: Dict[str, type] = {}

    def find_class(self, module, name):
        plain = _RENAMED_MODULES.get(module, module)
        if plain == "fairseq" or plain.startswith("fairseq."):
            qualified = f"{plain}.{name}"
            if qualified not in self._stand_ins:
                self._stand_ins[qualified] = type(name, (FairseqStandIn,), {"__module__": plain})
            return self._stand_ins[qualified]
        obj = None
        if (plain, name) in _ALLOWED or (plain == "builtins" and name in _BUILTIN_TYPES):
            obj = super().find_class(module, name)
        elif plain in _OMEGACONF_MODULES:
            found = super().find_class(module, name)
            # its containers, value nodes and their metadata; never functions or OmegaConf itself
            obj = found if isinstance(found, type) and issubclass(found, _OMEGACONF_DATA) else None
        elif plain == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            obj = getattr(torch, name)
        if obj is None:
            raise pickle.UnpicklingError(f"global {plain}.{name} is not on the allow-list")
        return obj


def _restricted_load(file, **kwargs):
    return RestrictedUnpickler(file, **kwargs).load()


# What torch.load(pickle_module=...) needs: a name, an Unpickler class and load().
_RESTRICTED_PICKLE = types.SimpleNamespace(__name__=__name__, Unpickler=RestrictedUnpickler,
                                           load=_restricted_load)


def load_fairseq_checkpoint(path: str, trust: bool) -> Dict:
    """The raw fairseq checkpoint dict at ``path``. Safe loading first; the
    restricted unpickler only with ``trust`` (``--trust-checkpoint``)."""
    _check_is_file(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types for bad files
        safe_error = e
    found = fairseq_globals(path)
    if not found:
        raise CheckpointError(
            f"Cannot load {path} ({why_unloadable(safe_error)}): it is not a fairseq checkpoint, or it is "
            "truncated or corrupt; pass a checkpoint that fairseq wrote (checkpoint_best.pt, "
            "checkpoint_last.pt, ...).")
    if not trust:
        raise CheckpointError(
            f"{path} pickles Python objects ({', '.join(sorted(found)[:4])}): fairseq before 0.12 saved its "
            "config that way. Loading such a file can run arbitrary code, so it is refused by default. If you "
            "trust where the file comes from, pass --trust-checkpoint (only allow-listed classes are rebuilt, "
            "fairseq's as inert stand-ins); the converted checkpoint then loads safely everywhere.")
    try:
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_RESTRICTED_PICKLE)
    except Exception as e:  # noqa: BLE001 - the unpickler and torch raise many types
        raise CheckpointError(
            f"Cannot load {path} even with --trust-checkpoint ({why_unloadable(e)}). "
            "Only plain data, tensors, argparse/omegaconf/numpy values and fairseq objects are rebuilt; load the "
            "checkpoint in fairseq and re-save it with fairseq 0.12 (its config is then plain data).") from None


def _check_is_file(path: str) -> None:
    if not os.path.exists(path):
        raise CheckpointError(f"{path} does not exist. Pass the path of a fairseq checkpoint "
                              "(checkpoint_best.pt, checkpoint_last.pt, ...).")
    if not os.path.isfile(path):
        what = "a directory" if os.path.isdir(path) else "not a regular file"
        raise CheckpointError(f"{path} is {what}, not a checkpoint file; pass a fairseq checkpoint file "
                              "(checkpoint_best.pt, checkpoint_last.pt, ...).")
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): an interrupted copy or a full disk, not a checkpoint. "
                              "Copy the fairseq checkpoint again.")


def why_unloadable(error: Exception) -> str:
    """torch's reason in a few words, never its advice to retry with weights_only=False
    (that would run any code the file holds)."""
    text = str(error).strip()
    refused = re.search(r"GLOBAL ([A-Za-z_][\w.]*)", text)
    if refused:
        return f"it pickles {refused.group(1)}, which is neither plain data nor a tensor"
    if text.startswith("Weights only load failed") or "weights_only" in text:
        return "its contents are not a pickle that torch.load can read"
    first = text.splitlines()[0][:200] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def looks_like_fairseq(state) -> bool:
    """True for a loaded fairseq checkpoint (ours have none of these keys)."""
    if not isinstance(state, dict):
        return False
    cfg = state.get("cfg")
    fairseq_cfg = isinstance(cfg, dict) and ("distributed_training" in cfg or "_name" in cfg)
    return "optimizer_history" in state or "args" in state or fairseq_cfg


def fairseq_globals(path: str) -> Set[str]:
    """The ``module.name`` globals of ``path``'s pickle that only fairseq
    checkpoints use, read with pickletools (nothing is unpickled); empty when
    there are none or the file is no pickle at all."""
    try:
        names = _pickle_globals(path)
    except Exception:  # noqa: BLE001 - garbage in, no fairseq globals out
        return set()
    return {n for n in names if n.split(".")[0] in FAIRSEQ_MODULES}


def _pickle_globals(path: str) -> Set[str]:
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
            return _globals_of(io.BytesIO(archive.read(name)), pickles=1)
    # torch's legacy format: a magic number, a protocol version, system info, then the object.
    with open(path, "rb") as f:
        return _globals_of(f, pickles=4)


def _globals_of(stream, pickles: int) -> Set[str]:
    # Protocol 2 (torch.save's) names globals inline; protocol 4's STACK_GLOBAL takes
    # the last two strings pushed (a memoized repeat is missed: the first use is enough).
    found, strings = set(), []
    for _ in range(pickles):
        for op, arg, _ in pickletools.genops(stream):
            if op.name == "GLOBAL":
                module, name = arg.split(" ", 1)
                found.add(f"{_RENAMED_MODULES.get(module, module)}.{name}")
            elif isinstance(arg, str) and "UNICODE" in op.name:
                strings.append(arg)
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.add(f"{strings[-2]}.{strings[-1]}")
    return found
