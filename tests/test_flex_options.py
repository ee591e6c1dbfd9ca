"""The FlexAttention adapter's soft-capping (``score_mod``) and sinks (O and LSE corrected from
the LSE Flex returns), on the CPU through flex_attention's eager reference path: compiled Flex
on a CPU returns no LSE and has no backward, so the adapter's wiring is checked here and the
compiled kernel (forward and gradients) only where CUDA is."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)
pytest.importorskip(
    "torch.nn.attention.flex_attention", reason="FlexAttention needs torch 2.5 or later"
)

import flashcheck  # noqa: E402
from flashcheck.harness.adapters.library import flex_function, with_sinks  # noqa: E402

OPTIONS = ("causal", "window", "mask", "scale", "softcap", "sinks")
SINKS = np.array([2.0, -1.5, 30.0, -30.0], np.float32)  # among, far above, far below the scores
pytestmark = pytest.mark.filterwarnings(
    "ignore:flex_attention called without torch.compile:UserWarning"
)


def _inputs(dtype, seed=0):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((2, 4, 24, 16)) * 3).astype(dtype)
    k = (rng.standard_normal((2, 2, 17, 16)) * 3).astype(dtype)
    v = rng.standard_normal((2, 2, 17, 16)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize(
    "opts",
    [{"softcap": 1.5}, {"sinks": SINKS}, {"softcap": 0.75, "sinks": SINKS}],
    ids=["softcap", "sinks", "both"],
)
def test_the_adapter_passes_softcap_and_sinks_on(dtype, opts):
    """Causal with Nq > Nk: the first rows keep no key (O = 0, LSE = σ with sinks)."""
    kern = flashcheck.kernel(flex_function(compiled=False), name="flex-eager", options=OPTIONS)
    res = flashcheck.check(kern, *_inputs(dtype), causal=True, save="never", **opts)
    assert res.passed, res.verdict.reasons


def test_a_kernel_that_drops_the_options_fails():
    """The same adapter with the options swallowed: the checks see it."""
    inner = flex_function(compiled=False)

    def drops(q, k, v, *, causal, window, scale, mask=None, softcap=None, sinks=None):
        return inner(q, k, v, causal=causal, window=window, scale=scale, mask=mask)

    kern = flashcheck.kernel(drops, name="flex-drops", options=OPTIONS)
    for opts in ({"softcap": 1.5}, {"sinks": SINKS}):
        res = flashcheck.check(kern, *_inputs(np.float32), causal=True, save="never", **opts)
        assert res.verdict.verdict == "FAIL-HARD", opts


def test_sinks_correction_of_rows_that_keep_no_key_and_its_gradient():
    o = torch.zeros(1, 2, 3, 4)
    o[:, :, 1:] = 1.0
    lse = torch.tensor([[[float("-inf"), 0.0, 5.0]] * 2])
    sinks = torch.tensor([0.0, 3.0], requires_grad=True)
    o2, lse2 = with_sinks(o, lse, sinks)
    assert torch.equal(o2[:, :, 0], torch.zeros(1, 2, 4))  # no key: O = 0, LSE = σ
    assert torch.equal(lse2[0, :, 0], sinks.detach())
    assert torch.allclose(lse2[0, 0, 1], torch.log(torch.tensor(2.0)))
    assert torch.allclose(o2[0, 0, 1], torch.full((4,), 0.5))
    # dσ_h = −Σ_i exp(σ_h − LSE'_i)·D_i, D_i = dO_i·O'_i
    do = torch.ones_like(o2)
    o2.backward(do)
    d = (do * o2.detach()).sum(-1)
    want = -(torch.exp(sinks.detach().reshape(1, -1, 1) - lse2.detach()) * d).sum(dim=(0, 2))
    assert torch.allclose(sinks.grad, want)
