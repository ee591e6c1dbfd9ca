"""Whether a plain function can be a kernel as written: flashcheck calls it as a dense kernel,
``fn(q, k, v, **options)``. One whose signature cannot take that call, or names the arguments
of another layout (FlashAttention's varlen, paged-cache or split-KV merge functions), is a
usage error that says how to declare it, before any probe calls it. A backward function that
cannot take the call flashcheck makes of it is refused the same way when it is declared."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["LAYOUT_NAMES", "check_backward_signature", "check_plain_signature"]


# Parameter names that mark a function written for another layout than (B, H, N, d) tensors.
LAYOUT_NAMES = (
    ({"cu_seqlens_q", "cu_seqlens_k"}, 'layout="varlen"'),
    ({"block_table", "cache_seqlens", "k_cache"}, 'layout="paged"'),
    ({"out_partial", "lse_partial"}, 'op="combine"'),
)


def check_plain_signature(fn: Callable[..., Any], spec: str) -> None:
    """A plain function is called as a dense kernel, ``fn(q, k, v, **options)``: one whose
    signature cannot take that call, or names another layout's arguments, is a usage error
    that says how to declare it (before any probe calls it)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (a builtin): the probe will see
        return
    names = set(sig.parameters)
    for marks, declare in LAYOUT_NAMES:
        if names & marks:
            raise ValueError(
                f"{spec} takes {', '.join(sorted(names & marks))}: a kernel of another layout. "
                f"Declare it at module level with flashcheck.kernel(fn, {declare}) and pass that "
                "name (docs/api.md, ragged batches)"
            )
    try:
        sig.bind(None, None, None)
    except TypeError as err:
        # An option without a default is the common case: flashcheck passes only the options
        # a case sets (a kernel need not take them all), so fn(q, k, v) must work.
        required = [
            n
            for i, (n, prm) in enumerate(sig.parameters.items())
            if i >= 3
            and prm.default is prm.empty
            and prm.kind not in (prm.VAR_POSITIONAL, prm.VAR_KEYWORD)
        ]
        why = (
            f"{', '.join(required)} {'has' if len(required) == 1 else 'have'} no default, and "
            "flashcheck passes only the options a case sets: give "
            + ("it a default" if len(required) == 1 else "them defaults")
            if required
            else str(err)
        )
        raise ValueError(
            f"{spec}{sig} cannot be called as a kernel ({why}): flashcheck calls fn(q, k, v, *, "
            "causal=..., scale=..., ...) with (B, H, N, d) tensors and takes O or (O, LSE) back"
        ) from None


def check_backward_signature(backward: Callable[..., Any], opts: frozenset[str]) -> None:
    """A backward function is called ``backward(q, k, v, do, **options)`` with the options the
    forward takes (``opts``) that a case sets: one whose signature cannot take that call is a
    declaration error, said when the kernel is declared rather than as an ERROR per case."""
    try:
        sig = inspect.signature(backward)
    except (TypeError, ValueError):  # no signature to read (a builtin)
        return
    params = sig.parameters.values()
    name = getattr(backward, "__name__", "backward")
    try:
        sig.bind(None, None, None, None)
    except TypeError as err:
        raise ValueError(
            f"backward {name}{sig} cannot be called as backward(q, k, v, do, **options) ({err}): "
            "give every parameter after do a default"
        ) from None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    missing = sorted(o for o in opts if o not in sig.parameters)
    if missing:
        keys = ", ".join(f"{o}=..." for o in missing)
        said = " or ".join([", ".join(missing[:-1]), missing[-1]] if len(missing) > 1 else missing)
        raise ValueError(
            f"backward {name}{sig} takes no {said}, which the forward takes and "
            f"flashcheck passes to both when a case sets them: add {keys} to the backward "
            "(with the forward's defaults), or **options"
        )
