"""Finding kernels: built-in names, entry points and ``package.module:function`` specs. The
declaration of a plain function's contract, :func:`~flashcheck.harness.adapters.declare.kernel`,
is in :mod:`flashcheck.harness.adapters.declare`.

``resolve(spec)`` accepts a built-in name (:data:`BUILTIN`), a name registered under the
``flashcheck.kernels`` entry-point group, or ``"package.module:attribute"`` where the attribute
is a :class:`~flashcheck.harness.adapters.adapter.Kernel` or a plain function taking torch
tensors. A plain function's contract is whatever its signature and a probe on tiny inputs show
(:mod:`flashcheck.harness.adapters.probe`); its arithmetic is ``"unknown"``.
"""

from __future__ import annotations

import difflib
import importlib
import multiprocessing
import os
import sys
from dataclasses import replace
from typing import Any

from .adapter import Kernel
from .builtin import project_kernels
from .declare import kernel
from .library import library_kernels
from .spec_check import check_plain_signature

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "NAMED_ONLY",
    "SUITE_KERNELS",
    "as_kernel",
    "builtin_kernels",
    "declared_spec",
    "entry_point_kernels",
    "resolve",
]

ENTRY_POINT_GROUP = "flashcheck.kernels"
# The project's own kernels: what `flashcheck test builtin` and the repository's suite run.
SUITE_KERNELS = (
    "triton",
    "triton-tf32",
    "recurrence-fa2",
    "recurrence-fa1",
    "naive-numpy",
    "naive-torch",
)
# Built-in kernels a campaign runs only when named: triton-atomic is triton's forward with the
# fused backward (checked against the oracle by the tests); in every default campaign it would
# repeat triton's forward work, and its gradients vary run to run on a GPU. triton-approx-tanh
# differs from triton on soft-capped cases alone.
NAMED_ONLY = frozenset({"triton-atomic", "triton-approx-tanh"})


def builtin_kernels() -> dict[str, Kernel]:
    """The project's own kernels and the library ones of
    :mod:`flashcheck.harness.adapters.library`, by name."""
    return {**project_kernels(), **library_kernels()}


BUILTIN = tuple(builtin_kernels())


def entry_point_kernels() -> dict[str, Any]:
    """Kernels other packages register under the ``flashcheck.kernels`` entry-point group.

    In the registering package's ``pyproject.toml``::

        [project.entry-points."flashcheck.kernels"]
        mykernel = "mypkg.attention:forward"

    The object may be a :class:`Kernel` (e.g. made by :func:`kernel`) or a plain function (see
    :func:`resolve`). Returns name → entry point (loaded only when used).
    """
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def as_kernel(obj: Any, spec: str | None = None) -> Kernel:
    """``obj`` as a :class:`Kernel`: a Kernel itself, a spec string (:func:`resolve`), or a
    plain function (its contract to be probed on first use)."""
    if isinstance(obj, Kernel):
        # A declaration bound to another name than its function's is shown, and saved, by
        # that name (flashcheck test named it so; check() named the function).
        name = declared_spec(obj) if spec is None else spec
        return replace(obj, name=name) if name != obj.name else obj
    if isinstance(obj, str):
        return resolve(obj)
    if callable(obj):
        made = kernel(obj)
        return replace(made, name=spec) if spec is not None else made
    raise TypeError(
        f"expected a kernel: a function, a flashcheck.kernel(...) or a spec string, got "
        f"{type(obj).__name__}"
    )


# What a declaration sets beyond the function (compared to find the one a kernel came from).
_DECLARED = (
    "arithmetic", "tanh", "nan_inputs", "deterministic", "batch_invariant", "backward",
    "backward_arithmetic", "key_block", "layout", "op",
)  # fmt: skip


def declared_spec(kern: Kernel) -> str:
    """A spec that resolves to ``kern``'s declaration, for a case file: its name, unless that
    is the default ``module:function`` of a ``flashcheck.kernel(fn, ...)`` bound to another
    name of that module, then ``module:that_name`` (the one declaration of ``fn`` there with
    the same settings), else the same in the module the declaration was made in. Before, a
    case saved by ``flashcheck.check(declared, ...)`` replayed the plain function, without
    the declaration (its tanh, class, NaN policy, ...)."""
    module_name, colon, attr = kern.name.partition(":")
    module = sys.modules.get(module_name) if colon else None
    if module is None or isinstance(getattr(module, attr, None), Kernel):
        return kern.name
    # The function's module first, then the one the declaration was made in (a script's
    # __main__ cannot be imported by a later replay).
    for where in dict.fromkeys([module_name, kern.declared_in]):
        found = sys.modules.get(where) if where and where != "__main__" else None
        if found is None:
            continue
        same = [
            key
            for key, obj in vars(found).items()
            if isinstance(obj, Kernel)
            and obj.fn is kern.fn
            and all(getattr(obj, f) == getattr(kern, f) for f in _DECLARED)
        ]
        if len(same) == 1:
            return f"{where}:{same[0]}"
    return kern.name


def resolve(spec: str) -> Kernel:
    """The kernel named by ``spec``.

    ``spec`` is a built-in name (:data:`BUILTIN`), a name registered under the
    ``flashcheck.kernels`` entry-point group, or ``"package.module:attribute"``. The object
    found is a :class:`Kernel`, or a plain function ``fn(q, k, v, **options)`` taking torch
    tensors and returning ``O`` or ``(O, LSE)``: it then gets arithmetic ``"unknown"``, and its
    contract is probed on first use. ``ValueError`` says why a spec cannot be resolved.
    """
    table = builtin_kernels()
    if spec in table:
        return table[spec]
    if ":" not in spec:
        eps = entry_point_kernels()
        if spec in eps:
            try:
                obj = eps[spec].load()
            except Exception as err:  # a broken plugin: say which, do not crash the caller
                raise ValueError(
                    f"cannot load entry point {spec!r} ({eps[spec].value}): "
                    f"{type(err).__name__}: {err}"
                ) from None
            return _named(obj, spec)
        known = ", ".join([*BUILTIN, *sorted(eps)])
        mod, dot, attr = spec.rpartition(".")
        hint = f" (did you mean '{mod}:{attr}'?)" if dot and mod and attr else ""
        raise ValueError(
            f"unknown kernel {spec!r}{hint}: use one of {known} or 'package.module:function'"
        )
    mod_name, _, attr = spec.partition(":")
    # Like `python -m`, look for the user's module in the current directory first.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except Exception as err:  # ImportError, or whatever the user's module raised on import
        hint = ""
        if isinstance(err, ModuleNotFoundError) and err.name == mod_name.split(".")[0]:
            hint = " (run from the folder it is importable from, or set PYTHONPATH)"
        elif multiprocessing.parent_process() is not None:
            # (a module that imported in the flashcheck process, whose spawned workers import
            # it afresh: what differs between the two is the user's to find)
            hint = " (in a worker process, which imports the kernel's module afresh)"
        raise ValueError(
            f"cannot import {mod_name!r} for kernel {spec!r}: {type(err).__name__}: {err}{hint}"
        ) from None
    try:
        obj = getattr(mod, attr)
    except AttributeError:
        names = [n for n in vars(mod) if not n.startswith("_") and callable(getattr(mod, n))]
        close = difflib.get_close_matches(attr, names, n=3)
        hint = f" (did you mean {', '.join(f'{mod_name}:{n}' for n in close)}?)" if close else ""
        raise ValueError(f"module {mod_name!r} has no attribute {attr!r}{hint}") from None
    return _named(obj, spec)


def _named(obj: Any, spec: str) -> Kernel:
    if not (isinstance(obj, Kernel) or callable(obj)):
        raise ValueError(f"{spec!r} is neither a flashcheck kernel nor a callable")
    if not isinstance(obj, Kernel):
        check_plain_signature(obj, spec)
    return as_kernel(obj, spec)
