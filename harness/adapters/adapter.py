"""The kernel contract: how the harness calls a kernel and what the kernel promises.

A :class:`Kernel` wraps a function ``fn(q, k, v, *, causal, window, mask, scale)`` that returns
``O`` or ``(O, LSE)`` and states its contract: the arithmetic class (which error bound applies,
:mod:`flashcheck.harness.judging.bounds`), the dtypes, devices, head dims, masks and options it
accepts, whether it takes grouped-query heads, ``Nq != Nk``, ``dv != d``, several (batch, head)
slices, and which multiple every sequence length must be. Cases outside the contract are never
generated for it; a failure inside the contract is the kernel's.

A contract is declared (the built-in kernels, :func:`flashcheck.kernel`) or discovered by
probing a plain function on tiny inputs (:mod:`flashcheck.harness.adapters.probe`); the kernels
the harness knows and ``package.module:function`` specs are looked up in
:mod:`flashcheck.harness.adapters.registry`.

A call's record and its helpers are in :mod:`~flashcheck.harness.adapters.kernel_call`, the
checked outputs and the errors of a call in :mod:`~flashcheck.harness.adapters.kernel_output`;
their names are importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cases.case import Case
from .call_limit import kernel_call
from .kernel_call import (
    Before,
    KernelCall,
    ieee_quiet,
    named_arrays,
    notify_before,
    raised_by,
)
from .kernel_output import (
    NO_TENSOR,
    KernelGradients,
    KernelOutput,
    KernelOutputError,
    KernelUnsupported,
    checked_gradients,
    checked_output,
)
from .softmax_options import option_values, unsupported_option

__all__ = [
    "ALL_DTYPES",
    "CONTRACT_FIELDS",
    "NAN_POLICIES",
    "NO_TENSOR",
    "Before",
    "Kernel",
    "KernelCall",
    "KernelGradients",
    "KernelOutput",
    "KernelOutputError",
    "KernelUnsupported",
    "score_magnitude",
]

ALL_DTYPES = ("fp16", "bf16", "fp32")
ALL_MASKS = frozenset({"causal", "window", "mask"})
# What a kernel promises for outputs a NaN input is involved in: NaN ("propagate", the
# contract) or any value ("any": e.g. nan_to_num on the probabilities, reported as a convention).
NAN_POLICIES = ("propagate", "any")
FP32_SCORES = 1e37  # fp32 score accumulators: |scale·q·k| and its partial sums stay finite
# The contract fields a probe can discover (everything else is declared or defaulted).
CONTRACT_FIELDS = (
    "dtypes",
    "head_dims",
    "masks",
    "options",
    "gqa",
    "unequal_lengths",
    "distinct_dv",
    "seq_multiple",
    "batched",
    "compile_keys",
)


@dataclass(frozen=True, repr=False)
class Kernel:
    """A kernel and its contract.

    ``api``: ``"numpy"`` (inputs as numpy arrays) or ``"torch"`` (tensors on the device).
    ``arithmetic``: a class of :data:`flashcheck.harness.judging.bounds.ARITHMETIC_CLASSES`
    (``"unknown"``: judged against the loosest bound of every known class, docs/error-bounds.md).
    ``dtypes``, ``devices``: what it runs. ``head_dims``: the head dims it accepts (``None``:
    any up to ``max_head_dim``). ``masks``: among ``causal``, ``window``, ``mask``.
    ``options``: the keyword options ``fn`` takes among ``causal``, ``window``, ``mask``,
    ``scale``, ``softcap``, ``sinks`` (``None``: the first four); options it lacks are not
    passed, and a case that needs one is outside its contract.
    ``gqa``: accepts fewer key/value heads than query heads; ``unequal_lengths``: ``Nq != Nk``;
    ``distinct_dv``: a value head dim other than ``d``; ``batched``: several (batch, head)
    slices in one call; ``seq_multiple``: every sequence length must be a multiple of it.
    ``score_limit``: per dtype, the largest ``scale·Σ|q||k|`` the kernel is specified for.
    ``deterministic``: repeated calls are bitwise identical. ``batch_invariant``: a (batch,
    head) slice computed alone is bitwise identical to the same slice of a batched call. Both
    default to ``False``, as in :func:`flashcheck.kernel`: a kernel promises nothing it does not
    declare, and is then compared with itself within its error bound instead.
    ``backward``: how to get the kernel's gradients for an upstream ``dO``: ``"autograd"``
    (torch autograd through ``fn``'s O), a function ``bwd(q, k, v, do, **options) -> (dQ, dK,
    dV)``, or ``None`` (no backward: gradient checks skip the kernel). ``backward_arithmetic``:
    the class whose gradient bounds apply (:mod:`flashcheck.harness.judging.gradient_bounds`;
    ``"unknown"``, the default: the loosest of them, whatever the forward's class).
    ``backward_score_limit``: the largest ``scale·Σ|q||k|`` the backward is specified for (a
    FlashAttention-2 backward recomputes P from fp32 scores and LSE, each rounded by about
    ``2^-24·|s|``: at huge logits P itself overflows).
    ``tanh``: the soft-cap's tanh, ``"accurate"`` (within 2 fp32 ulp) or ``"approx"`` (the GPU's
    ``tanh.approx.f32``): it sets the tanh's term in the bounds of soft-capped cases.
    ``compile_keys``: the dimensions (Recipe field names, ``compilekeys.COMPILE_DIMS``) whose
    every new value costs a compile; generators draw them from a palette
    (:mod:`~flashcheck.harness.adapters.palette`). ``compile_seconds``: one compile (0: unknown).
    ``unsupported``: ``(what, why)`` for each input class a probe found the kernel to reject.
    ``pending``: contract fields not declared and not yet probed
    (:func:`flashcheck.harness.adapters.probe.resolved` fills them in).
    ``layout`` (``"dense"``, ``"varlen"``, ``"paged"``) and ``op`` (``"attention"``,
    ``"combine"``): how the kernel is called (:mod:`~flashcheck.harness.adapters.ragged_call`).
    ``declared_in``: the module that called :func:`flashcheck.kernel` (a saved case names the
    declaration there when the function lives elsewhere).
    """

    name: str
    fn: Callable[..., Any]
    arithmetic: str = "unknown"
    api: str = "torch"
    dtypes: tuple[str, ...] = ALL_DTYPES
    devices: tuple[str, ...] = ("cpu", "cuda")
    masks: frozenset[str] = ALL_MASKS
    max_head_dim: int = 256
    head_dims: tuple[int, ...] | None = None
    options: frozenset[str] | None = None
    gqa: bool = True
    unequal_lengths: bool = True
    distinct_dv: bool = True
    batched: bool = True
    seq_multiple: int = 1
    key_block: int | None = None
    deterministic: bool = False
    batch_invariant: bool = False
    score_limit: dict[str, float] = field(default_factory=dict)
    check_available: Callable[[str, str], str | None] | None = None
    check_case: Callable[[Case, str | None], str | None] | None = None
    backward: Callable[..., Any] | str | None = None
    backward_arithmetic: str = "unknown"
    backward_score_limit: float | None = None
    nan_inputs: str = "propagate"
    tanh: str = "accurate"
    compile_keys: tuple[str, ...] = ()
    compile_seconds: float = 0.0
    unsupported: tuple[tuple[str, str], ...] = ()
    pending: frozenset[str] = frozenset()
    layout: str = "dense"
    op: str = "attention"
    declared_in: str = ""

    def __repr__(self) -> str:
        return f"<Kernel {self.name!r}: {'; '.join(self.contract_lines()[:3])}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # Hypothesis prints a failing example's arguments with this protocol; without it a
        # dataclass is spelled field by field (25 lines for one kernel).
        printer.text(f"<Kernel {self.name!r}>")

    def unavailable(self, dtype: str, device: str) -> str | None:
        """Why this kernel cannot run ``dtype`` on ``device`` here, or ``None`` if it can."""
        if dtype not in self.dtypes:
            why = dict(self.unsupported).get(dtype)
            return f"{self.name} does not support {dtype}" + (f" ({why})" if why else "")
        if device not in self.devices:
            return f"{self.name} does not run on {device}"
        if self.check_available is not None:
            return self.check_available(dtype, device)
        return None

    def supports(self, case: Case, device: str | None = None) -> str | None:
        """Why ``case`` is outside this kernel's contract (on ``device``, if given), or ``None``
        if it is inside."""
        if self.layout != "dense" or self.op != "attention":
            kind = "split-KV combine" if self.op == "combine" else self.layout
            return f"a {kind} kernel takes no dense (B, H, N, d) case"
        b, hq, hk, nq, nk, d, dv = case.shape
        if case.causal and "causal" not in self.masks:
            return "causal masks unsupported"
        if case.window is not None and "window" not in self.masks:
            return "windows unsupported"
        if case.mask is not None and "mask" not in self.masks:
            return "explicit masks unsupported"
        if max(d, dv) > self.max_head_dim:
            return f"head dim > {self.max_head_dim}"
        if self.head_dims is not None and not {d, dv} <= set(self.head_dims):
            return f"head dims ({d}, {dv}) not among {self.head_dims}"
        if dv != d and not self.distinct_dv:
            return "dv != d unsupported"
        if hq != hk and not self.gqa:
            return "grouped-query heads (Hq != Hk) unsupported"
        if nq != nk and not self.unequal_lengths:
            return "Nq != Nk unsupported"
        if b * hq > 1 and not self.batched:
            return "more than one (batch, head) slice unsupported"
        m = self.seq_multiple
        if m > 1 and (nq % m or nk % m):
            return f"sequence lengths ({nq}, {nk}) not multiples of {m}"
        if case.scale is not None and self.options is not None and "scale" not in self.options:
            return "an explicit scale is unsupported"
        if (why := unsupported_option(case, self.options)) is not None:
            return why
        limit = self.score_limit.get(case.dtype, FP32_SCORES)
        if score_magnitude(case) >= limit:
            return f"scores reach {score_magnitude(case):.3g} >= the kernel's limit {limit:.3g}"
        if self.check_case is not None:
            return self.check_case(case, device)
        return None

    def backward_supports(self, case: Case, device: str | None = None) -> str | None:
        """Why the gradients of ``case`` are outside this kernel's contract, or ``None``."""
        if self.backward is None:
            return f"{self.name} declares no backward"
        why = self.supports(case, device)
        if why is None and self.backward_score_limit is not None:
            mag = score_magnitude(case)
            if mag >= self.backward_score_limit:
                why = (
                    f"scores reach {mag:.3g} >= the backward's limit "
                    f"{self.backward_score_limit:.3g}"
                )
        return why

    def contract_lines(self) -> list[str]:
        """The contract in words, one item a line (for terminal headers and reports)."""
        dims = (
            ", ".join(map(str, self.head_dims))
            if self.head_dims is not None
            else f"any <= {self.max_head_dim}"
        )
        yes = {True: "yes", False: "no"}
        if not self.dtypes and self.unsupported:
            return [
                f"arithmetic {self.arithmetic}; ran on none of the probe inputs: "
                f"{self.unsupported[0][1]}"
            ]
        masks = ", ".join(sorted(self.masks)) or "none"
        if not self.masks and self.options is not None and not self.options & ALL_MASKS:
            masks += " (the signature names no causal, window or mask keyword"
            if self.fn is not None and "is_causal" in _parameters(self.fn):
                masks += "; is_causal= is SDPA's spelling: flashcheck passes causal="
            masks += ")"
        promised = [
            w
            for w, on in (
                ("deterministic", self.deterministic),
                ("batch-invariant", self.batch_invariant),
            )
            if on
        ]
        # (a ragged layout's lengths are its own: no multiple is probed or declared for them)
        lengths = (
            "" if self.layout != "dense" else f"; sequence lengths multiple of {self.seq_multiple}"
        )
        lines = [
            f"arithmetic {self.arithmetic}; dtypes {', '.join(self.dtypes) or 'none'}; "
            f"devices {_devices_here(self.devices)}",
            f"head dims {dims}; masks {masks}{lengths}",
            f"GQA {yes[self.gqa]}; Nq != Nk {yes[self.unequal_lengths]}; dv != d "
            f"{yes[self.distinct_dv]}; batch/heads > 1 {yes[self.batched]}; "
            # promises, checked as such (measured either way: a report's batch invariance)
            + (
                f"declared {' and '.join(promised)}"
                if promised
                else "declared neither deterministic nor batch-invariant"
            ),
        ]
        if self.op == "combine" or self.layout != "dense":
            lines[0] += "; split-KV merge" if self.op == "combine" else f"; layout {self.layout}"
        softmax = sorted((self.options or frozenset()) & {"softcap", "sinks"})
        if softmax:
            tanh = f" (tanh {self.tanh})" if "softcap" in softmax else ""
            lines.append(f"softmax options {', '.join(softmax)}{tanh}")
        if self.compile_keys:
            cost = f" (about {self.compile_seconds:.2g} s each)" if self.compile_seconds else ""
            lines.append(f"compile keys {', '.join(self.compile_keys)}{cost}")
        lines += [f"unsupported: {what} ({why})" for what, why in self.unsupported]
        return lines

    def _options(self, case: Case, device: str = "cpu", grad: bool = False) -> dict[str, Any]:
        opts = {"causal": case.causal, "window": case.window, "scale": case.scale}
        if case.mask is not None:
            opts["mask"] = case.mask
        if self.options is not None:
            opts = {key: val for key, val in opts.items() if key in self.options}
        if self.fn is not None:
            # Through **kwargs an option arrives only when the case sets it: a user's kernel
            # that forwarded its keywords to a function without `window` raised on every call
            # when handed window=None.
            named = _parameters(self.fn)
            opts = {key: val for key, val in opts.items() if key in named or val is not None}
        return {**opts, **option_values(case, self.api, device, grad)}

    def run_backward(self, case: Case, device: str = "cpu") -> KernelGradients:
        """The kernel's ``dQ``, ``dK``, ``dV`` for the case's upstream gradient
        (:meth:`Case.grad_output`), copied exactly to float64."""
        return self.gradients(case, self.call_backward(case, device))

    def call_backward(
        self, case: Case, device: str = "cpu", before: Before | None = None
    ) -> KernelCall:
        """Call the kernel's backward on ``case`` and its ``dO``: a :class:`KernelCall` whose
        ``args`` are ``q``, ``k``, ``v``, ``do`` (and ``mask``) as handed over. ``before``, if
        given, is called with those ``args`` just before the kernel runs."""
        if self.backward is None:
            raise ValueError(f"{self.name} declares no backward (Kernel.backward is None)")
        opts = self._options(case, device, grad=not callable(self.backward))
        if self.api == "numpy":
            if not callable(self.backward):
                raise ValueError(
                    f"{self.name}: a numpy kernel needs a backward function; torch autograd "
                    "only differentiates torch kernels"
                )
            do = case.grad_output_as("numpy")
            args = named_arrays(case.q, case.k, case.v, opts, do=do)
            notify_before(before, args)
            with ieee_quiet(), kernel_call(self.name, case), self._raised(case, backward=True):
                res = self.backward(case.q, case.k, case.v, do, **opts)
            return KernelCall(args, res)
        import torch

        q, k, v = (t.requires_grad_(True) for t in case.to_torch(device))
        do_t = case.grad_output_as("torch", device)
        if "mask" in opts:
            opts["mask"] = torch.from_numpy(np.array(case.mask, copy=True)).to(device)
        # A function backward gets detached views: the same storage as q, k, v.
        args = named_arrays(q.detach(), k.detach(), v.detach(), opts, do=do_t)
        notify_before(before, args)
        with (
            torch.enable_grad(),
            ieee_quiet(),
            kernel_call(self.name, case),
            self._raised(case, backward=True),
        ):
            if callable(self.backward):
                res = self.backward(args["q"], args["k"], args["v"], do_t, **opts)
            else:
                out = self.fn(q, k, v, **opts)
                o = out[0] if isinstance(out, tuple | list) else out
                if not getattr(o, "requires_grad", False):
                    raise KernelOutputError(
                        f"{self.name}'s O does not depend on q, k, v through torch "
                        "autograd: declare backward=None, or pass a backward function"
                    )
                wrt = (q, k, v) + ((opts["sinks"],) if "sinks" in opts else ())
                res = torch.autograd.grad(o, wrt, grad_outputs=do_t, allow_unused=True)
                # An input O does not depend on has gradient 0 (judged as such).
                res = [
                    torch.zeros_like(x) if g is None else g for g, x in zip(res, wrt, strict=True)
                ]
        return KernelCall(args, res)

    def _raised(self, case: Case, *, backward: bool = False) -> Any:
        """The note an exception of the kernel's own function carries out (PEP 678)."""
        if not backward:
            return raised_by(self.name, case)
        what = "autograd through" if not callable(self.backward) else "the backward of"
        return raised_by(f"{what} {self.name}", case)

    def gradients(self, case: Case, call: KernelCall) -> KernelGradients:
        """A backward call's ``(dQ, dK, dV)`` checked and copied exactly to float64."""
        return checked_gradients(self.name, case, call)

    def run(self, case: Case, device: str = "cpu", inputs: tuple | None = None) -> KernelOutput:
        """Call the kernel on ``case`` and copy its outputs exactly to float64.

        ``inputs``: ``(q, k, v)`` to pass instead of the case's own arrays (same values, e.g.
        views into padded buffers); numpy arrays or tensors on ``device`` according to ``api``.
        """
        return self.output(case, self.call(case, device, inputs))

    def call(
        self,
        case: Case,
        device: str = "cpu",
        inputs: tuple | None = None,
        before: Before | None = None,
    ) -> KernelCall:
        """Call the kernel on ``case`` (``inputs`` as in :meth:`run`): a :class:`KernelCall`
        whose ``args`` are ``q``, ``k``, ``v`` (and ``mask``) as handed over. ``before``, if
        given, is called with those ``args`` just before the kernel runs."""
        opts = self._options(case)
        if self.api == "numpy":
            q, k, v = inputs if inputs is not None else (case.q, case.k, case.v)
            notify_before(before, named_arrays(q, k, v, opts))
            # Kernels compute in IEEE arithmetic: overflow and NaN are results to be judged
            # (the NaN-rule and bound properties look at them), not warnings to raise.
            with ieee_quiet(), kernel_call(self.name, case), self._raised(case):
                res = self.fn(q, k, v, **opts)
        else:
            import torch

            q, k, v = inputs if inputs is not None else case.to_torch(device)
            opts = self._options(case, device)
            if "mask" in opts:
                opts["mask"] = torch.from_numpy(np.array(case.mask, copy=True)).to(device)
            notify_before(before, named_arrays(q, k, v, opts))
            # (the Triton interpreter runs numpy: IEEE quiet there too)
            with torch.no_grad(), ieee_quiet(), kernel_call(self.name, case), self._raised(case):
                res = self.fn(q, k, v, **opts)
        return KernelCall(named_arrays(q, k, v, opts), res)

    def output(self, case: Case, call: KernelCall) -> KernelOutput:
        """A forward call's ``O`` (and ``LSE``) checked and copied exactly to float64."""
        return checked_output(self.name, case, call)


def _devices_here(devices: tuple[str, ...]) -> str:
    """The devices of a contract, those this machine lacks marked so ("cuda (not available
    here)"): a contract printout must not promise a GPU run that cannot happen."""
    has_cuda = False
    if "cuda" in devices:
        try:
            import torch

            has_cuda = torch.cuda.is_available()
        except ImportError:
            pass
    return ", ".join(d if d != "cuda" or has_cuda else "cuda (not available here)" for d in devices)


def score_magnitude(case: Case) -> float:
    """``max scale·Σ_t |q_t||k_t|`` over finite inputs: bounds every score and partial sum."""
    tau = abs(case.scale) if case.scale is not None else 1 / math.sqrt(case.shape[5])
    exact = case.problem if case.descales else case  # FP8: the values times their descales
    q = np.nan_to_num(np.abs(exact.q.astype(np.float64)), nan=0, posinf=0)
    k = np.nan_to_num(np.abs(exact.k.astype(np.float64)), nan=0, posinf=0)
    rep = q.shape[1] // k.shape[1]
    k = np.repeat(k, rep, axis=1)
    return float(tau * (q @ np.swapaxes(k, -1, -2)).max(initial=0.0))


def _parameters(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The parameter names of ``fn`` (none where it has no readable signature)."""
    import inspect

    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()
