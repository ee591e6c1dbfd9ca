"""Which dimensions a kernel compiles on, from the times of its calls.

A JIT-specialized or autotuned kernel (Triton's ``constexpr`` lengths and head dims, an
autotuner keyed on them) pays a compile on the first call of every new key and runs fast on a
repeat. With ``first`` the time of the first call of a shape and ``repeat`` that of the same
call again, the compile overhead is ``c = first - repeat``; the kernel compiles at all when
``c >= COMPILE_MIN_S`` and ``first >= FIRST_RATIO · repeat``. The first call may hold one-time
costs besides (imports, a CUDA context), so the compile cost ``C`` is measured on later calls:
the slowest call on a shape not called before, less a repeat; none reaching ``COMPILE_MIN_S``
means no compile keys. A later call of time ``t`` on a new shape is a first call when
``t - repeat`` reaches ``COMPILE_MIN_S`` and :data:`FIRST_SHARE` of ``C``, and ``t`` is
``FIRST_RATIO`` repeats: compile costs differ widely between keys (a new dtype can cost four
times a new length), while a repeat costs milliseconds.

Each later call is compared with the first one (the base shape), in the dimensions of
:data:`COMPILE_DIMS` it changes. A first call that changed one dimension ``X`` alone shows ``X``
is a compile key (its key is new, and only ``X`` differs); a repeated-cost call that changed
``X`` alone, to a value no earlier call had, shows ``X`` is not. A first call that changed
several dimensions (a kernel that needs ``Nq = Nk`` changes both) makes keys of those among them
no call showed are not. Dimensions no call changed are not keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "COMPILE_DIMS",
    "COMPILE_MIN_S",
    "FIRST_RATIO",
    "CallTimes",
    "compile_cost",
    "infer_keys",
]

# The dimensions a kernel may specialize (compile, autotune) on, by their Recipe field names;
# ``d`` and ``dv`` are the query/key and value head dims.
COMPILE_DIMS = ("dtype", "nq", "nk", "d", "dv", "causal")

# A first call must cost this much more than a repeat to count as a compile: below it, a
# torch or CUDA warm-up on the first call (not repeated per shape) is not mistaken for one.
COMPILE_MIN_S = 0.5
FIRST_RATIO = 4.0

# One call: the values of COMPILE_DIMS it had, and its seconds.
Call = tuple[tuple[object, ...], float]


@dataclass(frozen=True)
class CallTimes:
    """The first and a repeated call of one shape, in seconds."""

    first: float
    repeat: float

    @property
    def overhead(self) -> float:
        """What the first call cost beyond a repeat: the compile estimate ``c``."""
        return max(0.0, self.first - self.repeat)

    @property
    def compiles(self) -> bool:
        """Whether the first call was markedly slower than the repeat (see the module)."""
        return self.overhead >= COMPILE_MIN_S and self.first >= FIRST_RATIO * self.repeat


def _new_calls(calls: Sequence[Call]) -> list[tuple[int, set[str], float]]:
    """``(index, dims changed from the first call, seconds)`` of each call on a shape not
    called before."""
    base = calls[0][0]
    out = []
    for i, (key, seconds) in enumerate(calls):
        if len(key) != len(COMPILE_DIMS):
            raise ValueError(f"a call's key has one value per {COMPILE_DIMS}, got {key!r}")
        changed = {dim for dim, a, b in zip(COMPILE_DIMS, base, key, strict=True) if a != b}
        if changed and all(key != earlier for earlier, _ in calls[:i]):
            out.append((i, changed, seconds))
    return out


# A later call on a new shape counts as a first call when it costs this share of the slowest
# such call beyond a repeat (and COMPILE_MIN_S at least). Measured on an H100 with an autotuned
# Triton kernel (16 configurations; benchmarks/probe_autotuned_times.py): a new dtype cost
# 11.8 s (bf16) and 46.3 s (fp32), a new length or head dim 12.9-16.1 s, a new length of the
# same specialization 1.8 s (a re-tune only): half the slowest would call most keys repeats.
FIRST_SHARE = 0.02


def _is_first(seconds: float, repeat: float, cost: float) -> bool:
    extra = seconds - repeat
    return (
        extra >= COMPILE_MIN_S and extra >= FIRST_SHARE * cost and seconds >= FIRST_RATIO * repeat
    )


def compile_cost(calls: Sequence[Call], times: CallTimes) -> float:
    """The compile estimate: the slowest call on a new shape after the first one, less a
    repeat (0 without such calls). The first call itself may hold one-time costs besides."""
    if not calls:
        return 0.0
    return max((s - times.repeat for _, _, s in _new_calls(calls)), default=0.0)


def infer_keys(calls: Sequence[Call], times: CallTimes) -> tuple[str, ...]:
    """The compile keys shown by ``calls`` (in call order, the first on the base shape; each
    the values of :data:`COMPILE_DIMS` and its seconds), in the order of :data:`COMPILE_DIMS`;
    ``()`` when the kernel does not compile (:attr:`CallTimes.compiles`) or no later call on a
    new shape cost :data:`COMPILE_MIN_S` more than a repeat."""
    if not times.compiles or not calls:
        return ()
    cost = compile_cost(calls, times)
    if cost < COMPILE_MIN_S:
        return ()
    single: dict[str, bool] = {}  # dim -> a first call, from the first call changing it alone
    joint: list[set[str]] = []  # the dims changed together by first calls
    for i, changed, seconds in _new_calls(calls):
        slow = _is_first(seconds, times.repeat, cost)
        if len(changed) > 1:
            if slow:
                joint.append(changed)
            continue
        (dim,) = changed
        j = COMPILE_DIMS.index(dim)
        fresh = all(earlier[j] != calls[i][0][j] for earlier, _ in calls[:i])
        if dim not in single and (slow or fresh):
            single[dim] = slow
    keys = {dim for dim, slow in single.items() if slow}
    for dims in joint:
        # A dimension changed only together with others is a key unless a call showed it is
        # not: taking it from the palette costs variety, missing it costs a compile per value.
        keys |= {dim for dim in dims if single.get(dim) is not False}
    return tuple(dim for dim in COMPILE_DIMS if dim in keys)
