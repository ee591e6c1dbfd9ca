"""The NaN rule (checks/nan_rule.py): NaN inputs reach every output they are involved in,
finite inputs give finite outputs, ±inf inputs excuse no kernel that swallows NaN, and NaN in
a fully masked row is named as the convention difference it is (top-left causal only where
the NaN rows tell the two apart). Each with a planted numpy kernel that fails it."""

import re

import numpy as np
import pytest
from structural_helpers import naive_fn, nan_to_zero, planted, small_case

import flashcheck
from flashcheck.harness.cases.case import Case
from flashcheck.harness.checks.registry import CHECKS
from flashcheck.harness.core.status import Status
from flashcheck.harness.judging.verdict import CONVENTION

PASS, FAIL = Status.PASS, Status.FAIL


def nan_everywhere(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """NaN for every output, finite inputs included."""
    o, _ = naive_fn(q, k, v, causal=causal, window=window, scale=scale, mask=mask)
    return np.full_like(o, np.nan)


def test_nan_rule_names_the_declaration_and_accepts_it_as_a_convention():
    case = small_case(family="nonfinite", seed=0)
    found = CHECKS["nan-rule"](planted(nan_to_zero), case, "cpu")
    assert found.status is FAIL
    # named with the input it sits in
    assert re.match(r"the NaN in [qkv]\[\d+, \d+, \d+, \d+\].* did not reach O", found.message)
    assert 'declare nan_inputs="any" in flashcheck.kernel, or --nan-inputs any' in found.message
    declared = CHECKS["nan-rule"](planted(nan_to_zero, nan_inputs="any"), case, "cpu")
    assert declared.status is PASS
    assert declared.message.startswith(
        f'{CONVENTION}NaN inputs give finite outputs (declared nan_inputs="any")'
    )


def test_nan_rule_fails_nan_from_finite_inputs_whatever_the_declaration():
    for policy in ("propagate", "any"):
        found = CHECKS["nan-rule"](planted(nan_everywhere, nan_inputs=policy), small_case(), "cpu")
        assert found.status is FAIL, policy
        assert found.message.startswith("NaN/Inf leaked into"), found


def test_nan_inputs_is_validated_with_the_choices_named():
    assert flashcheck.kernel(naive_fn, api="numpy").nan_inputs == "propagate"
    with pytest.raises(ValueError, match=r"nan_inputs must be one of \('propagate', 'any'\)"):
        flashcheck.kernel(naive_fn, api="numpy", nan_inputs="ignore")


def _softmax_numpy(q, k, v, *, causal, top_left):
    """Softmax attention in float64 with ``exp(s - max) / sum``: NaN for a row that keeps no
    key; the causal diagonal aligned top-left (j <= i) or bottom-right (j <= i + Nk - Nq);
    O in the inputs' format."""
    fmt = np.asarray(q).dtype
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    nq, nk = q.shape[2], k.shape[2]
    with np.errstate(all="ignore"):
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
        if causal:
            shift = 0 if top_left else nk - nq
            s = np.where(np.arange(nk)[None] <= np.arange(nq)[:, None] + shift, s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        return ((e / e.sum(-1, keepdims=True)) @ v).astype(fmt)


def test_nan_rule_names_a_top_left_causal_mask_only_where_the_nan_rows_tell_it_apart():
    """Nq = 4, Nk = 2, causal: rows 0 and 1 keep no key (bottom-right); top-left, row 0 keeps
    key 0 and row 1 keys 0 and 1. With a NaN in q[1], a top-left kernel gives NaN in row 1
    only; a kernel that gives NaN for every empty row gives it in rows 0 and 1, and only the
    NaN-for-masked-rows convention is named."""
    q = np.ones((1, 1, 4, 2), np.float32)
    q[0, 0, 1, 0] = np.nan
    k = np.array([[[[0.5, 1.0], [2.0, 0.0]]]], np.float32)
    case = Case(q, k, np.ones((1, 1, 2, 2), np.float32), causal=True)

    def top_left(q, k, v, *, causal=False, window=None, scale=None, mask=None):
        return _softmax_numpy(q, k, v, causal=causal, top_left=True)

    def nan_rows(q, k, v, *, causal=False, window=None, scale=None, mask=None):
        return _softmax_numpy(q, k, v, causal=causal, top_left=False)

    hint = "consistent with a causal mask aligned top-left"
    found = CHECKS["nan-rule"](planted(top_left), case, "cpu")
    assert found.message.startswith(f"{CONVENTION}fully masked rows give NaN (1 rows)")
    assert hint in found.message
    found = CHECKS["nan-rule"](planted(nan_rows), case, "cpu")
    assert found.message.startswith(f"{CONVENTION}fully masked rows give NaN (2 rows)")
    assert hint not in found.message
    # Nq = 2, Nk = 1, k = inf: the one empty row keeps the inf key top-left, and a kernel
    # ignoring the mask keeps it too; NaN there fits the convention as well, so both are
    # named, and not as a convention difference alone (a user's trial: an ignored causal
    # mask was reported as "convention difference")
    one = np.ones((1, 1, 1, 2), np.float32)
    case = Case(np.ones((1, 1, 2, 2), np.float32), one * np.inf, one, causal=True)
    for kernel in (top_left, nan_rows):
        found = CHECKS["nan-rule"](planted(kernel), case, "cpu")
        assert found.message.startswith(
            "fully masked rows give NaN (1 rows), not O = 0: either the NaN-for-masked-rows "
            "convention"
        ), found.message
        assert "the mask is not applied: row 0 of (b=0, h=0) drops key 0, whose " in found.message
        assert "k[0, 0, 0, 0] = inf" in found.message and hint not in found.message


def nan_to_zero_rows(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """Softmax attention that writes 0 for a row whose normaliser is not positive (NaN too):
    a flash kernel's ``where(l > 0, acc / l, 0)``, which turns NaN rows into zeros."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    with np.errstate(all="ignore"):
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
        e = np.exp(s - s.max(-1, keepdims=True))
        l_ = e.sum(-1, keepdims=True)
        o = np.where(l_ > 0, (e @ v) / l_, 0.0)
    return o.astype(np.float32)


def test_nan_rule_makes_infs_nan_so_that_a_kernel_zeroing_nan_rows_cannot_hide_behind_them():
    """A NaN in q's row 0 and +inf in k's key 1: every output involves the inf, which excuses
    it from the rule; made NaN, the inf must reach every row, and the kernel gives 0 there."""
    q = np.ones((1, 1, 3, 2), np.float32)
    q[0, 0, 0, 1] = np.nan
    k = np.array([[[[0.5, 1.0], [np.inf, 0.0], [1.0, 1.0]]]], np.float32)
    case = Case(q, k, np.ones((1, 1, 3, 2), np.float32))
    found = CHECKS["nan-rule"](planted(nan_to_zero_rows), case, "cpu")
    assert found.status is FAIL
    assert found.message.startswith("with the case's ±inf inputs made NaN, the NaN in q[0, 0, 0"), (
        found.message
    )
    assert CHECKS["nan-rule"](planted(naive_fn), case, "cpu").status is PASS


def test_options_applied_calls_nan_in_fully_masked_rows_the_convention_it_is():
    def nan_rows(q, k, v, *, causal=False, window=None, scale=None, mask=None):
        return _softmax_numpy(q, k, v, causal=causal, top_left=False)

    found = CHECKS["options-applied"](
        planted(nan_rows), small_case(n=20, nk=16, causal=True), "cpu"
    )
    assert found.message.startswith(f"{CONVENTION}fully masked rows give NaN (with causal=True)")


def test_nan_rule_names_a_top_left_mask_that_drops_the_nan_instead_of_the_declaration():
    """Nq = 2, Nk = 4, causal, NaN in k[1]: bottom-right, both rows keep key 1 (j <= i + 2);
    top-left, row 0 keeps key 0 alone. A top-left kernel's row 0 comes out finite: the hint
    must name the mask, not suggest nan_inputs="any". A kernel zeroing NaN rows is not named."""
    q = np.ones((1, 1, 2, 2), np.float32)
    k = np.ones((1, 1, 4, 2), np.float32)
    k[0, 0, 1, 0] = np.nan
    case = Case(q, k, np.ones((1, 1, 4, 2), np.float32), causal=True)

    def top_left(q, k, v, *, causal=False, window=None, scale=None, mask=None):
        return _softmax_numpy(q, k, v, causal=causal, top_left=True)

    found = CHECKS["nan-rule"](planted(top_left), case, "cpu")
    assert found.status is FAIL
    assert "consistent with a causal mask aligned top-left" in found.message, found
    assert "nan_inputs" not in found.message, found
    found = CHECKS["nan-rule"](planted(nan_to_zero_rows), case, "cpu")
    assert found.status is FAIL and "top-left" not in found.message, found
    assert 'declare nan_inputs="any"' in found.message, found


def test_nan_rule_names_both_readings_where_the_top_left_mask_involves_no_nan():
    """Nq = 1, Nk = 2, causal, NaN in k[1] only: top-left, row 0 keeps key 0 alone, so no
    output involves a NaN; a kernel zeroing NaN gives the same finite row. Both are named."""
    q = np.ones((1, 1, 1, 2), np.float32)
    k = np.ones((1, 1, 2, 2), np.float32)
    k[0, 0, 1, 0] = np.nan
    case = Case(q, k, np.ones((1, 1, 2, 2), np.float32), causal=True)

    def top_left(q, k, v, *, causal=False, window=None, scale=None, mask=None):
        return _softmax_numpy(q, k, v, causal=causal, top_left=True)

    found = CHECKS["nan-rule"](planted(top_left), case, "cpu")
    assert found.status is FAIL
    assert "either the kernel drops those keys (a causal mask aligned top-left" in found.message
    assert 'or it suppresses NaN on purpose (then declare nan_inputs="any"' in found.message


def test_nan_rule_names_a_mask_not_applied_where_dropped_keys_hold_inf():
    """Causal, Nq = Nk = 4, k's last key +inf: only row 3 keeps it. A kernel that ignores
    causal puts it in every row, and rows 0-2, whose inputs are finite, go NaN."""
    q = np.ones((1, 1, 4, 2), np.float32)
    k = np.ones((1, 1, 4, 2), np.float32)
    k[0, 0, 3, 0] = np.inf
    case = Case(q, k, np.ones((1, 1, 4, 2), np.float32), causal=True)

    def ignores_causal(q, k, v, *, causal=False, window=None, scale=None, mask=None):
        return _softmax_numpy(q, k, v, causal=False, top_left=False)

    found = CHECKS["nan-rule"](planted(ignores_causal), case, "cpu")
    assert found.status is FAIL
    assert found.message.startswith(
        "NaN/Inf leaked into 6 outputs whose inputs are finite (the row's q and every key its "
        "mask keeps)"
    ), found.message
    assert found.message.endswith(
        "; consistent with the mask not applied: row 0 of (b=0, h=0) drops key 3, whose "
        "k[0, 0, 3, 0] = inf"
    ), found.message
    assert CHECKS["nan-rule"](planted(naive_fn), case, "cpu").status is PASS
