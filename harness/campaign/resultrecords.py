"""The ``result`` records of a campaign's ``results.jsonl``: one kernel on one case, by part
(:class:`AccuracyResult` for the forward parts, :class:`StructuralResult`,
:class:`GradientResult`), with the parts of a record (shape, options, metrics) as types.

Each type reads and writes its own JSON (``from_json`` / ``to_json``). Numbers are decoded here
once (:func:`decode_number`): ``"nan"``, ``"inf"`` and ``"-inf"`` (how
:func:`~flashcheck.harness.core.resultlog.jsonable` writes non-finite floats) become floats,
``None`` (a value that does not apply) stays ``None``, and integers stay integers, so a record
read and written again is the same JSON. Fields that older files lack (``arithmetic``,
``class_util``) read as ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Self

from ..cases.families import Recipe
from ..core.resultlog import jsonable
from ..core.status import Status

__all__ = [
    "AccuracyResult",
    "CaseOptions",
    "CaseShape",
    "GradientMetrics",
    "GradientResult",
    "Metrics",
    "Number",
    "ResultRecord",
    "StructuralResult",
    "decode_number",
    "gradient_record",
    "recipe_from_json",
]

Number = int | float


def decode_number(x: Any) -> Number | None:
    """A number as :func:`~flashcheck.harness.core.resultlog.jsonable` wrote it: ``None`` stays
    ``None`` (not applicable), the strings ``"nan"``/``"inf"``/``"-inf"`` become floats,
    integers stay integers (and booleans booleans) so that writing the value again gives the
    same JSON."""
    if x is None or isinstance(x, bool):
        return x
    if isinstance(x, int):
        return x
    if hasattr(x, "item") and not isinstance(x, str):  # numpy scalar
        return decode_number(x.item())
    return float(x)


def _float(x: Any) -> float:
    """A number that is always there (``None``, from a broken writer, reads as NaN)."""
    v = decode_number(x)
    return float("nan") if v is None else v


def recipe_from_json(d: Mapping[str, Any]) -> Recipe:
    """The :class:`~flashcheck.harness.cases.families.Recipe` of a record (JSON turns the window
    tuple into a list; recipes written before a field existed take its default)."""
    out = dict(d)
    if out.get("window") is not None:
        out["window"] = tuple(out["window"])
    return Recipe(**out)


def gradient_record(part: str, tag: str) -> bool:
    """Whether the results of an item of ``part`` with ``tag`` are gradient results: the
    ``gradients`` part, and the items of the ``options`` part tagged ``gradients/...``."""
    return part == "gradients" or (part == "options" and tag.startswith("gradients/"))


# -- the parts of a result record ----------------------------------------------------------


@dataclass(frozen=True)
class CaseShape:
    """The case's shape: batch, query and key/value heads, lengths, head dims."""

    B: int
    Hq: int
    Hk: int
    Nq: int
    Nk: int
    d: int
    dv: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CaseShape:
        return cls(**{f.name: int(d[f.name]) for f in fields(cls)})

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CaseOptions:
    """The case's options: causal, the sliding window, an explicit mask, the scale, and the
    softmax options (the cap ``softcap``, the per-head logits ``sinks``; written only where
    set, so records without them read and write as before)."""

    causal: bool = False
    window: tuple[int | None, int | None] | None = None
    mask: bool = False
    scale: float | None = None
    softcap: float | None = None
    sinks: tuple[float, ...] | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CaseOptions:
        win, sinks = d.get("window"), d.get("sinks")
        return cls(
            causal=bool(d.get("causal", False)),
            window=None if win is None else tuple(win),
            mask=bool(d.get("mask", False)),
            scale=decode_number(d.get("scale")),
            softcap=decode_number(d.get("softcap")),
            sinks=None if sinks is None else tuple(float(x) for x in sinks),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "causal": self.causal,
            "window": None if self.window is None else list(self.window),
            "mask": self.mask,
            "scale": self.scale,
        }
        if self.softcap is not None:
            out["softcap"] = self.softcap
        if self.sinks is not None:
            out["sinks"] = list(self.sinks)
        return out


@dataclass(frozen=True)
class Metrics:
    """The numbers of a judged forward case (see :func:`~flashcheck.harness.campaign.records.
    result_fields`); ``None``: does not apply (no naive baseline, no LSE, ...), or absent from
    an older file. ``max_ulp`` is NaN or inf where the kernel returned NaN/±Inf where the exact
    result is finite."""

    max_ulp: Number | None = None
    median_ulp: Number | None = None
    max_ulp_int: Number | None = None
    det_util: Number | None = None
    prob_util: Number | None = None
    naive_ulp: Number | None = None
    naive_ratio: Number | None = None
    lse_err: Number | None = None
    lse_det_util: Number | None = None
    normwise_rel: Number | None = None
    rmse: Number | None = None
    sse: Number | None = None
    oracle_rn_sse: Number | None = None
    n_finite: Number | None = None
    max_abs: Number | None = None
    nonfinite_mismatches: Number | None = None
    count: Number | None = None
    has_lse: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Metrics:
        kw: dict[str, Any] = {f.name: decode_number(d[f.name]) for f in fields(cls) if f.name in d}
        kw["has_lse"] = bool(d.get("has_lse", False))
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        return jsonable(asdict(self))


@dataclass(frozen=True)
class GradientMetrics:
    """The verdict and numbers of one gradient tensor (dQ, dK or dV) of a judged case."""

    verdict: Status
    max_ulp: Number
    det_util: Number | None = None
    prob_util: Number | None = None
    naive_ulp: Number | None = None
    naive_ratio: Number | None = None
    worst: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GradientMetrics:
        return cls(
            verdict=Status(d["verdict"]),
            max_ulp=_float(d.get("max_ulp")),
            det_util=decode_number(d.get("det_util")),
            prob_util=decode_number(d.get("prob_util")),
            naive_ulp=decode_number(d.get("naive_ulp")),
            naive_ratio=decode_number(d.get("naive_ratio")),
            worst=tuple(d.get("worst", ())),
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = str(self.verdict)
        out["worst"] = list(self.worst)
        return jsonable(out)


@dataclass(frozen=True, kw_only=True)
class ResultRecord:
    """One kernel on one case: what every part's result holds. ``score`` is the failure margin
    (above 1 fails; infinite for a broken result); ``seconds`` is timing, not a result;
    ``arithmetic`` is ``None`` in files that did not record it."""

    TYPE: ClassVar[str] = "result"
    key: str
    part: str
    tag: str
    kernel: str
    dtype: str
    device: str
    family: str
    arithmetic: str | None = None
    recipe: Recipe
    shape: CaseShape
    options: CaseOptions
    status: Status
    reasons: tuple[str, ...] = ()
    score: Number = 0.0
    seconds: dict[str, float] | None = None

    @property
    def reason(self) -> str:
        """The first reason, or ``""``."""
        return self.reasons[0] if self.reasons else ""

    @property
    def generation(self) -> int:
        """The search generation that made this case (-1 outside the search)."""
        return int(self.tag.split("/")[0]) if self.part == "search" else -1

    @staticmethod
    def common_json(d: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments of the fields every part shares."""
        return {
            "key": d["key"],
            "part": d["part"],
            "tag": d["tag"],
            "kernel": d["kernel"],
            "dtype": d["dtype"],
            "device": d["device"],
            "family": d["family"],
            "arithmetic": d.get("arithmetic"),
            "recipe": recipe_from_json(d["recipe"]),
            "shape": CaseShape.from_json(d["shape"]),
            "options": CaseOptions.from_json(d.get("options", {})),
            "status": Status(d["status"]),
            "reasons": tuple(d.get("reasons", ())),
            "score": _float(d.get("score", 0.0)),
            "seconds": d.get("seconds"),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ResultRecord:
        """The record of ``d``'s part (:class:`StructuralResult`, :class:`GradientResult`, or
        :class:`AccuracyResult` for every other part)."""
        if cls is ResultRecord:
            cls = StructuralResult if d["part"] == "structural" else AccuracyResult
            if gradient_record(d["part"], d["tag"]):
                cls = GradientResult
        return cls(**cls.common_json(d), **cls.part_json(d))

    @classmethod
    def judged(cls, common: Mapping[str, Any], verdict: Mapping[str, Any]) -> Self:
        """A judged result: the fields every part shares (``common``, typed) and those the
        judge gave (``verdict``: :func:`~flashcheck.harness.campaign.records.result_fields`
        or :func:`~flashcheck.harness.campaign.records.gradient_fields`)."""
        return cls(
            **common,
            status=Status(verdict["status"]),
            reasons=tuple(verdict["reasons"]),
            score=_float(verdict["score"]),
            **cls.part_json(verdict),
        )

    @classmethod
    def part_json(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments of the fields of this part alone."""
        return {}

    def _json(self, **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.TYPE,
            "key": self.key,
            "part": self.part,
            "tag": self.tag,
            "kernel": self.kernel,
            "dtype": self.dtype,
            "device": self.device,
            "family": self.family,
        }
        if self.arithmetic is not None:
            out["arithmetic"] = self.arithmetic
        out.update(
            recipe=self.recipe.to_json(),
            shape=self.shape.to_json(),
            options=self.options.to_json(),
            status=str(self.status),
            reasons=list(self.reasons),
            score=self.score,
        )
        if self.seconds is not None:
            out["seconds"] = self.seconds
        out.update({k: v for k, v in extra.items() if v is not None})
        return jsonable(out)

    def to_json(self) -> dict[str, Any]:
        return self._json()


@dataclass(frozen=True, kw_only=True)
class AccuracyResult(ResultRecord):
    """A forward result (parts ``grid``, ``length``, ``edge``, ``logit``, ``fa3``, ``search``).
    A judged one (PASS, FAIL, FAIL-HARD) has ``metrics``, ``class_util`` (max error / bound of
    each arithmetic class, ``None`` where the output is not finite; absent in older files),
    ``ulp_hist`` and ``worst`` (the worst elements, as the verdict wrote them); a SKIP or broken
    one has none of them. ``max_logit`` and ``finite_inputs`` describe the case."""

    max_logit: Number | None = None
    finite_inputs: bool = True
    class_util: dict[str, Number | None] | None = None
    metrics: Metrics | None = None
    ulp_hist: tuple[int, ...] | None = None
    worst: tuple[dict[str, Any], ...] | None = None

    @classmethod
    def part_json(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        cu, hist, worst = d.get("class_util"), d.get("ulp_hist"), d.get("worst")
        out = {
            "class_util": None if cu is None else {k: decode_number(v) for k, v in cu.items()},
            "metrics": None if "metrics" not in d else Metrics.from_json(d["metrics"]),
            "ulp_hist": None if hist is None else tuple(int(x) for x in hist),
            "worst": None if worst is None else tuple(worst),
        }
        if "max_logit" in d:  # (judged: given with the shared fields instead)
            out["max_logit"] = decode_number(d["max_logit"])
            out["finite_inputs"] = bool(d.get("finite_inputs", True))
        return out

    def to_json(self) -> dict[str, Any]:
        return self._json(
            max_logit=self.max_logit,
            finite_inputs=self.finite_inputs if self.max_logit is not None else None,
            class_util=self.class_util,
            metrics=None if self.metrics is None else self.metrics.to_json(),
            ulp_hist=None if self.ulp_hist is None else list(self.ulp_hist),
            worst=None if self.worst is None else list(self.worst),
        )

    def metric(self, name: str) -> Number | None:
        """The metric ``name`` (``None``: not judged, not applicable, or not recorded)."""
        return None if self.metrics is None else getattr(self.metrics, name)

    @property
    def utilization(self) -> float | None:
        """The deterministic-bound utilization as tables and figures show it: ``None`` where it
        does not apply; ∞ where the kernel returned NaN/Inf for a finite exact value (files
        written before the verdict recorded it so carry the finite elements' value)."""
        v = self.metric("det_util")
        if v is None or math.isnan(float(v)):
            return None
        if not math.isfinite(float(self.metrics.max_ulp)):
            return math.inf
        return float(v)


@dataclass(frozen=True, kw_only=True)
class StructuralResult(ResultRecord):
    """A structural property of a kernel on one case (``property``: its name)."""

    property: str

    @classmethod
    def part_json(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        return {"property": d["property"]}

    def to_json(self) -> dict[str, Any]:
        return self._json(property=self.property)


@dataclass(frozen=True, kw_only=True)
class GradientResult(ResultRecord):
    """dQ, dK and dV (and dσ, ``dsinks``, for a case with sinks) of a kernel's backward on one
    case: the worst verdict is ``status``, each tensor's verdict and numbers are in
    ``gradients`` (absent for a SKIP or broken result)."""

    gradients: dict[str, GradientMetrics] | None = None

    @classmethod
    def part_json(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        g = d.get("gradients")
        return {
            "gradients": None
            if g is None
            else {k: GradientMetrics.from_json(v) for k, v in g.items()}
        }

    def to_json(self) -> dict[str, Any]:
        g = self.gradients
        return self._json(gradients=None if g is None else {k: v.to_json() for k, v in g.items()})
