"""Typed result records for the tests of what reports and gates say about them."""

from flashcheck.harness.campaign.resultrecords import (
    AccuracyResult,
    CaseOptions,
    CaseShape,
    GradientResult,
    StructuralResult,
)
from flashcheck.harness.cases.families import Recipe
from flashcheck.harness.core.status import Status


def result_record(status, part="grid", **kw):
    """A typed result record of kernel ``k``, fp16, with ``status``."""
    recipe = Recipe("fp16", "randn", 1, 1, 1, 4, 4, 8, 8, 0)
    fields = {"property": "nan-rule"} if part == "structural" else {}
    cls = {"structural": StructuralResult, "gradients": GradientResult}.get(part, AccuracyResult)
    return cls(
        key="x",
        part=part,
        tag="t",
        kernel="k",
        dtype="fp16",
        device="cpu",
        family="randn",
        recipe=recipe,
        shape=CaseShape(1, 1, 1, 4, 4, 8, 8),
        options=CaseOptions(),
        status=Status(status),
        **{**fields, **kw},
    )
