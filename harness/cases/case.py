"""A test case: exact inputs plus the attention options, independent of how it was generated.

A :class:`Case` is what a property test, the report campaign and ``flashcheck replay`` hand to a
kernel. Inputs are numpy arrays in their own format (``float16``, ``ml_dtypes.bfloat16`` or
``float32``), so the values tested are exactly the values stored and printed; torch tensors are
made from their bit patterns (:meth:`Case.to_torch`), never through a rounding cast.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import ml_dtypes
import numpy as np

from ..core.formats import Format, format_of
from ..core.fp8 import DESCALES, as_fp8_array, fp8_format_of
from ..core.semantics import AttentionProblem, make_problem

__all__ = ["CASE_DTYPES", "DO_LAYOUTS", "DTYPES", "FP8_DTYPES", "Case"]

DTYPES: dict[str, np.dtype] = {
    "fp16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp32": np.dtype(np.float32),
}
# FP8 inputs (with descales) are cases too, but not a dtype the dense campaigns loop over.
FP8_DTYPES: dict[str, np.dtype] = {
    "e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
    "e5m2": np.dtype(ml_dtypes.float8_e5m2),
}
CASE_DTYPES: dict[str, np.dtype] = {**DTYPES, **FP8_DTYPES}
_BITS = {
    "fp16": np.uint16,
    "bf16": np.uint16,
    "fp32": np.uint32,
    "e4m3": np.uint8,
    "e5m2": np.uint8,
}
# How a gradient check hands ``dO`` to a backward: a fresh contiguous array; a view into a larger
# NaN-filled buffer (a backward that assumes contiguous strides reads the padding); one row of
# ``dv`` values broadcast with zero strides, as autograd hands over the gradient of ``O.sum()``.
DO_LAYOUTS = ("contiguous", "strided", "expanded")


@dataclass
class Case:
    """Inputs ``q (B, Hq, Nq, d)``, ``k (B, Hk, Nk, d)``, ``v (B, Hk, Nk, dv)`` and options.

    ``family``, ``seed`` and ``params`` record where the case came from (the input family of
    docs/properties.md and the RNG seed that filled its tensors); they do not affect the
    computation.
    ``do``: the upstream gradient ``dO`` ``(B, Hq, Nq, dv)`` for gradient checks, in the
    inputs' dtype; ``None`` means the default one of :meth:`grad_output`. ``do_layout``: how
    ``dO`` is handed to the kernel's backward (:data:`DO_LAYOUTS`, :meth:`grad_output_as`); an
    ``"expanded"`` ``dO`` has one row of values, the same for every (batch, head, query).
    ``softcap`` and ``sinks`` (float32 ``(Hq,)``): the softmax options of
    :func:`~flashcheck.harness.core.semantics.check_softcap_sinks` (``None``: off).
    ``descale_q``, ``descale_k``, ``descale_v``: for FP8 inputs (``float8_e4m3fn``,
    ``float8_e5m2``), float32 ``(B, Hk)`` factors (``None``: 1); the exact input is the FP8
    value times its descale (:mod:`flashcheck.harness.core.fp8`).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    causal: bool = False
    window: tuple[int | None, int | None] | None = None
    mask: np.ndarray | None = None
    scale: float | None = None
    family: str = "manual"
    seed: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    do: np.ndarray | None = None
    do_layout: str = "contiguous"
    softcap: float | None = None
    sinks: np.ndarray | None = None
    descale_q: np.ndarray | None = None
    descale_k: np.ndarray | None = None
    descale_v: np.ndarray | None = None

    def __post_init__(self) -> None:
        names = {x.dtype for x in (self.q, self.k, self.v)}
        if len(names) != 1 or next(iter(names)) not in CASE_DTYPES.values():
            raise ValueError(
                f"q, k, v must share one dtype among {sorted(CASE_DTYPES)} (numpy arrays or "
                f"torch tensors), got {[str(x.dtype) for x in (self.q, self.k, self.v)]}"
            )
        self._check_descales()
        if self.mask is not None and self.mask.dtype != np.bool_:
            raise ValueError("mask must be a boolean array (True = keep)")
        if self.do is not None:
            want = (*self.q.shape[:3], self.v.shape[3])
            if self.do.dtype != self.q.dtype or self.do.shape != want:
                raise ValueError(
                    f"do must be an array of O's shape {want} and the inputs' dtype "
                    f"{self.q.dtype}, got {self.do.dtype} {self.do.shape}"
                )
        if self.sinks is not None:
            sinks = np.asarray(self.sinks)
            if sinks.dtype != np.float32 or sinks.shape != (self.q.shape[1],):
                raise ValueError(
                    f"sinks must be a float32 array of one logit per query head, shape "
                    f"({self.q.shape[1]},), got {sinks.dtype} {sinks.shape}"
                )
        if self.do_layout not in DO_LAYOUTS:
            raise ValueError(f"do_layout must be one of {DO_LAYOUTS}, got {self.do_layout!r}")
        if self.do_layout == "expanded" and self.do is not None:
            row = self.do.reshape(-1, self.do.shape[-1])
            if not (row == row[:1]).all():
                raise ValueError(
                    "an expanded dO has one row of values broadcast over (batch, head, query): "
                    "pass a do whose rows are all equal, or another do_layout"
                )

    def _check_descales(self) -> None:
        given = [n for n in DESCALES if getattr(self, n) is not None]
        if given and self.dtype not in FP8_DTYPES:
            raise ValueError(f"{', '.join(given)} apply to FP8 cases only, not {self.dtype}")
        want = (self.q.shape[0], self.k.shape[1])
        for name in given:
            d = getattr(self, name)
            if not isinstance(d, np.ndarray) or d.dtype != np.float32 or d.shape != want:
                raise ValueError(f"{name} must be a float32 array of shape (B, Hk) = {want}")

    @property
    def descales(self) -> dict[str, np.ndarray]:
        """The descales that are set, by keyword (an FP8 kernel is handed all three, ones for
        those unset: :mod:`flashcheck.harness.adapters.softmax_options`)."""
        return {n: getattr(self, n) for n in DESCALES if getattr(self, n) is not None}

    @cached_property
    def problem(self) -> AttentionProblem:
        """The validated problem: the inputs as exact float64 arrays and the options, made once
        per case and shared by the oracle, the bounds and the checks (the inputs are not
        meant to change after the case is made)."""
        return make_problem(self.q, self.k, self.v, **self.options(), **self.descales)

    def __getstate__(self) -> dict[str, Any]:
        # The problem is derived from the fields: a pickled case (sent to a worker process)
        # carries only its inputs, and the receiver rebuilds the problem when it needs one.
        return {key: val for key, val in self.__dict__.items() if key != "problem"}

    def with_grad_output(self, do: np.ndarray) -> Case:
        """This case with the upstream gradient ``do`` (an array of O's shape in the inputs'
        dtype), sharing its :attr:`problem`."""
        out = replace(self, do=do)
        if "problem" in self.__dict__:
            out.__dict__["problem"] = self.problem
        return out

    def grad_output(self) -> np.ndarray:
        """The upstream gradient ``dO`` of gradient checks: :attr:`do` if given, else standard
        normal values in the inputs' format drawn from a seed that is a hash of the inputs'
        bits, so that the same inputs always get the same ``dO`` (and a replay needs nothing
        more than the case)."""
        if self.do is not None:
            return self.do
        h = hashlib.sha256()
        for name in ("q", "k", "v"):
            h.update(self.bits(name).tobytes() + str(getattr(self, name).shape).encode())
        rng = np.random.default_rng(int.from_bytes(h.digest()[:8], "little"))
        shape = (*self.q.shape[:3], self.v.shape[3])
        do = rng.standard_normal(shape).astype(np.float32).astype(self.q.dtype)
        if self.do_layout == "expanded":  # the first row, broadcast (same draw, same values)
            do = np.broadcast_to(do[:1, :1, :1], shape).copy()
        return do

    def grad_output_as(self, api: str, device: str = "cpu") -> Any:
        """``dO`` (:meth:`grad_output`) as handed to a backward in :attr:`do_layout`: a numpy
        array (``api="numpy"``) or a torch tensor on ``device``. ``"strided"``: a view into a
        buffer one larger in batch and heads, 3 in queries and 5 in ``dv``, filled with NaN;
        ``"expanded"``: one row broadcast with stride 0 over (batch, head, query) (read-only
        in numpy, as ``np.broadcast_to`` gives it)."""
        do = self.grad_output()
        if self.do_layout == "contiguous":
            return do if api == "numpy" else self.tensor(do, device)
        if self.do_layout == "expanded":
            if api == "numpy":
                return np.broadcast_to(do[:1, :1, :1], do.shape)
            return self.tensor(do[:1, :1, :1], device).expand(*do.shape)
        pad = (1, 1, 3, 5)
        buf = np.full(tuple(n + p for n, p in zip(do.shape, pad, strict=True)), np.nan, do.dtype)
        buf[1:, :-1, 2:-1, 3:-2] = do
        return (buf if api == "numpy" else self.tensor(buf, device))[1:, :-1, 2:-1, 3:-2]

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # Hypothesis prints a falsifying example with this protocol; without it a dataclass
        # is spelled field by field, every array in full.
        printer.text(repr(self))

    def __repr__(self) -> str:
        rec = self.params.get("recipe")
        if rec is not None:
            args = ", ".join(f"{key}={val!r}" for key, val in rec.items())
            expr = f"make_case(Recipe({args}))"
            # Options set on the made case (the property suite's soft-caps and sinks), not by
            # the recipe: the expression sets them too (dataclasses.replace, numpy as np).
            extra = []
            if self.softcap is not None and rec.get("cap_factor") is None:
                extra.append(f"softcap={self.softcap!r}")
            if self.sinks is not None and rec.get("sink_offset") is None:
                logits = [float(x) for x in np.asarray(self.sinks).ravel()]
                extra.append(f"sinks=np.array({logits!r}, np.float32)")
            if extra:
                expr = f"replace({expr}, {', '.join(extra)})"
            return f"{expr}  # {self.describe()}"
        body = self.describe()
        if self.q.size + self.k.size + self.v.size <= 96:
            bits = {n: [hex(int(x)) for x in self.bits(n).ravel()] for n in ("q", "k", "v")}
            body += f"; bits {bits}"
        return f"Case({body})"

    @property
    def dtype(self) -> str:
        """The input format's name: ``"fp16"``, ``"bf16"``, ``"fp32"``, ``"e4m3"``, ``"e5m2"``."""
        return format_of(self.q.dtype).name

    @property
    def fmt(self) -> Format:
        return format_of(self.q.dtype)

    @property
    def shape(self) -> tuple[int, int, int, int, int, int, int]:
        """``(B, Hq, Hk, Nq, Nk, d, dv)``."""
        b, hq, nq, d = self.q.shape
        return b, hq, self.k.shape[1], nq, self.k.shape[2], d, self.v.shape[3]

    def options(self) -> dict[str, Any]:
        """Keyword arguments shared by the oracle, the bounds and the kernels (``softcap`` and
        ``sinks`` only where set: a kernel that takes neither is called as before)."""
        opts = {
            "causal": self.causal,
            "window": self.window,
            "mask": self.mask,
            "scale": self.scale,
        }
        if self.softcap is not None:
            opts["softcap"] = self.softcap
        if self.sinks is not None:
            opts["sinks"] = self.sinks
        return opts

    def describe(self) -> str:
        b, hq, hk, nq, nk, d, dv = self.shape
        opts = []
        if self.causal:
            opts.append("causal")
        if self.window is not None:
            opts.append(f"window={self.window}")
        if self.mask is not None:
            opts.append("mask")
        if self.scale is not None:
            opts.append(f"scale={self.scale!r}")
        if self.softcap is not None:
            opts.append(f"softcap={self.softcap!r}")
        if self.sinks is not None:
            opts.append(f"sinks={[float(x) for x in self.sinks]}")
        if self.do_layout != "contiguous":
            opts.append(f"dO {self.do_layout}")
        for name, factors in self.descales.items():
            opts.append(f"{name}={[float(x) for x in factors.ravel()]}")
        extra = f" {' '.join(opts)}" if opts else ""
        return (
            f"{self.family} {self.dtype} B={b} Hq={hq} Hk={hk} Nq={nq} Nk={nk} d={d} dv={dv}"
            f"{extra} seed={self.seed}"
        )

    def bits(self, name: str) -> np.ndarray:
        """The bit patterns of input ``name`` (``"q"``, ``"k"`` or ``"v"``) as unsigned ints."""
        return np.ascontiguousarray(getattr(self, name)).view(_BITS[self.dtype])

    @classmethod
    def from_bits(cls, dtype: str, q: np.ndarray, k: np.ndarray, v: np.ndarray, **kw) -> Case:
        """Rebuild a case from bit patterns (the inverse of :meth:`bits`)."""
        if dtype not in CASE_DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(CASE_DTYPES)}")
        want = np.dtype(_BITS[dtype])
        arrays = []
        for name, x in (("q", q), ("k", k), ("v", v)):
            x = np.asarray(x)
            if x.dtype != want:
                raise ValueError(f"{name} bits must be {want}, got {x.dtype}")
            arrays.append(np.ascontiguousarray(x).view(CASE_DTYPES[dtype]))
        return cls(*arrays, **kw)

    @classmethod
    def from_arrays(
        cls,
        q: Any,
        k: Any,
        v: Any,
        *,
        causal: bool = False,
        window: tuple[int | None, int | None] | None = None,
        mask: Any = None,
        scale: float | None = None,
        softcap: float | None = None,
        sinks: Any = None,
        descale_q: Any = None,
        descale_k: Any = None,
        descale_v: Any = None,
    ) -> Case:
        """A case from numpy arrays or torch tensors (any device) in fp16, bf16 or fp32 (or FP8
        with its descales), values taken exactly; ``mask`` a boolean array or tensor (True =
        keep), broadcastable to ``(B, Hq, Nq, Nk)``; ``softcap``, ``sinks`` as the oracle takes
        them."""
        if mask is not None and type(mask).__module__.startswith("torch"):
            mask = mask.detach().cpu().numpy()
        if mask is not None and np.asarray(mask).dtype != np.bool_:
            raise ValueError(
                f"mask must be boolean (True = keep), got dtype {np.asarray(mask).dtype}"
            )
        # The one validation and float64 conversion of the inputs, kept as the case's problem.
        problem = make_problem(
            q,
            k,
            v,
            causal=causal,
            window=window,
            mask=mask,
            scale=scale,
            softcap=softcap,
            sinks=sinks,
            descale_q=descale_q,
            descale_k=descale_k,
            descale_v=descale_v,
        )
        if problem.fp8 is not None:  # the case keeps the FP8 values, the problem their products
            dtype = FP8_DTYPES[problem.fp8.fmt.name]
            arrays = [
                as_fp8_array(x, n)[0].astype(dtype) for n, x in zip("qkv", (q, k, v), strict=True)
            ]
            given = {"descale_q": descale_q, "descale_k": descale_k, "descale_v": descale_v}
            scaling = {
                n: d.astype(np.float32)
                for n, d in problem.fp8.descales().items()
                if given[n] is not None
            }
        else:
            dtype = DTYPES[problem.fmt.name]
            arrays = [x.astype(dtype) for x in (problem.q, problem.k, problem.v)]
            scaling = {}
        case = cls(
            *arrays,  # exact: the values came from that format
            causal=bool(causal),
            window=window,
            mask=None if mask is None else np.asarray(mask),
            scale=None if scale is None else float(scale),
            softcap=problem.softcap,
            sinks=None if problem.sinks is None else problem.sinks.astype(np.float32),
            **scaling,
        )
        case.__dict__["problem"] = problem
        return case

    def to_torch(self, device: str = "cpu") -> tuple[Any, Any, Any]:
        """``(q, k, v)`` as torch tensors on ``device``, bit-exact."""
        return tuple(self.tensor(getattr(self, name), device) for name in ("q", "k", "v"))

    def tensor(self, x: np.ndarray, device: str = "cpu") -> Any:
        """A torch tensor on ``device`` with the bits of ``x`` (an array of the case's dtype)."""
        import torch

        x = np.ascontiguousarray(x)
        if fp8_format_of(x) is not None:
            t = torch.from_numpy(x.view(np.uint8).copy()).view(format_of(x.dtype).torch_dtype)
        elif self.dtype == "fp32":
            t = torch.from_numpy(x.copy())
        else:
            t = torch.from_numpy(x.view(np.int16).copy()).view(
                torch.bfloat16 if self.dtype == "bf16" else torch.float16
            )
        return t.to(device)

    def take(self, batch: Sequence[int]) -> Case:
        """The case made of the sequences ``batch`` (indices into the batch axis, repeats
        allowed), in that order, with the options and, where given, the mask and ``dO`` rows
        of those sequences."""
        idx = np.asarray(batch, dtype=np.intp)
        b, hq, _, nq, nk, *_ = self.shape
        mask = None
        if self.mask is not None:
            mask = np.broadcast_to(self.mask, (b, hq, nq, nk))[idx].copy()
        return Case(
            self.q[idx],
            self.k[idx],
            self.v[idx],
            causal=self.causal,
            window=self.window,
            mask=mask,
            scale=self.scale,
            family=self.family,
            seed=self.seed,
            params=dict(self.params),
            do=None if self.do is None else self.do[idx],
            do_layout=self.do_layout,
            softcap=self.softcap,
            sinks=self.sinks,
            **{n: d[idx] for n, d in self.descales.items()},
        )

    def slice(self, b: int, h: int) -> Case:
        """The single-(batch, head) case of query head ``h`` (with its key/value head)."""
        _, hq, hk, *_ = self.shape
        kvh = h // (hq // hk)
        mask = None
        if self.mask is not None:
            full = np.broadcast_to(
                self.mask, (self.q.shape[0], hq, self.q.shape[2], self.k.shape[2])
            )
            mask = full[b : b + 1, h : h + 1].copy()
        return Case(
            np.ascontiguousarray(self.q[b : b + 1, h : h + 1]),
            np.ascontiguousarray(self.k[b : b + 1, kvh : kvh + 1]),
            np.ascontiguousarray(self.v[b : b + 1, kvh : kvh + 1]),
            causal=self.causal,
            window=self.window,
            mask=mask,
            scale=self.scale,
            family=self.family,
            seed=self.seed,
            params=dict(self.params),
            do=None if self.do is None else np.ascontiguousarray(self.do[b : b + 1, h : h + 1]),
            softcap=self.softcap,
            sinks=None if self.sinks is None else self.sinks[h : h + 1].copy(),
            **{n: d[b : b + 1, kvh : kvh + 1].copy() for n, d in self.descales.items()},
        )
