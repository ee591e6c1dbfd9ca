"""Kernel workers run the kernel the parent knows: its spec, declarations, overrides and probed
contract travel as a KernelRef, and every call answers one Outcome, whatever happened in the
child (a value, an exception, a wrong output, a declined input, a crash, a hang)."""

import ast
import os
import pickle
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

import flashcheck
from flashcheck.harness.adapters.adapter import Kernel, KernelUnsupported
from flashcheck.harness.adapters.outcome import Outcome
from flashcheck.harness.adapters.probe import probe
from flashcheck.harness.adapters.registry import resolve
from flashcheck.harness.adapters.worker import KernelRef, KernelWorker
from flashcheck.harness.campaign.executor import LocalExecutor
from flashcheck.harness.campaign.processes import worker_gpus
from flashcheck.harness.cases.families import Recipe, make_case
from flashcheck.harness.checks.registry import check_target
from flashcheck.harness.checks.structural import StructuralResult
from flashcheck.harness.core.status import Status
from flashcheck.kernels.naive import naive_numpy

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).stem  # the child process imports this module by the kernels' specs


def _naive(q, k, v, *, causal=False, window=None, scale=None):
    return naive_numpy(q, k, v, causal=causal, window=window, scale=scale)


def _noisy(q, k, v, *, causal=False, window=None, scale=None):
    """One output element moves by one ulp, at random, on every call."""
    o, lse = _naive(q, k, v, causal=causal, window=window, scale=scale)
    o = o.copy()
    i = np.random.default_rng().integers(o.size)
    o.flat[i] = np.nextafter(o.flat[i], np.inf, dtype=o.dtype)
    return o, lse


# Plain declarations, as a user writes them: nothing promised, arithmetic unknown.
noisy = flashcheck.kernel(_noisy, api="numpy", devices=("cpu",))
naive = flashcheck.kernel(_naive, api="numpy", devices=("cpu",))


def raises(q, k, v, *, causal=False):
    raise ValueError("bad stride")


def declines(q, k, v, *, causal=False):
    raise KernelUnsupported("the backend takes no such shape")


def wrong_shape(q, k, v, *, causal=False):
    return q[..., :1]


def crashes(q, k, v, *, causal=False):
    os._exit(3)


def hangs(q, k, v, *, causal=False):
    time.sleep(60)


def contract_seen(kernel, case, device):
    """A check that reports the contract of the kernel the worker runs."""
    seen = {f.name: getattr(kernel, f.name) for f in fields(Kernel) if f.name != "fn"}
    return StructuralResult.passed(repr(sorted(seen.items(), key=str)))


def _case(b=2, h=2, n=16, d=16, dtype="fp32"):
    return make_case(Recipe(dtype, "randn", b, h, h, n, n, d, d, seed=1))


def _as_parent_knows_it(spec, **overrides):
    """The kernel as a campaign holds it: resolved, probed, then overridden (``--arithmetic``)."""
    return replace(probe(resolve(spec)), **overrides)


def test_the_child_runs_the_kernel_with_the_parents_whole_contract():
    kern = _as_parent_knows_it(f"{HERE}:noisy", arithmetic="naive", deterministic=True)
    ref = KernelRef.of(kern, f"{HERE}:noisy")
    with KernelWorker(timeout=120) as worker:
        seen = worker.check(f"{HERE}:contract_seen", ref, _case(), "cpu", 1)
        assert seen.ok, seen
        want = {f.name: getattr(kern, f.name) for f in fields(Kernel) if f.name != "fn"}
        # The functions are rebuilt in the child: compare the rest of the contract.
        for name in ("check_available", "check_case", "backward"):
            want.pop(name)
        for name, value in want.items():
            assert f"('{name}', {value!r})" in seen.value.message, name
        # Declared deterministic: two runs must be bitwise equal, and this kernel's are not.
        # (A worker that rebuilt the kernel from its spec alone compared them within twice the
        # bound, and passed.)
        found = worker.check(check_target("determinism"), ref, _case(), "cpu", 2)
    assert found.ok and found.value.status is Status.FAIL, found


def test_an_overridden_arithmetic_reaches_the_campaigns_workers():
    # `--arithmetic flash` on a plain function: conformance to the flash class then applies. A
    # worker that rebuilt the kernel from its spec saw arithmetic "unknown" and skipped it.
    spec = "recurrence-fa2"
    flash = resolve(spec)
    plain = replace(flash, arithmetic="unknown")
    case = make_case(Recipe("fp16", "randn", 1, 2, 2, 16, 16, 16, 16, seed=2))
    with LocalExecutor(workers=1, kernel_workers=1, timeout=120) as ex:
        skipped = ex.check("conformance", KernelRef.of(plain, spec), case, "cpu", 2).result()
        ran = ex.check("conformance", KernelRef.of(flash, spec), case, "cpu", 2).result()
    assert skipped.value.status is Status.NOT_APPLICABLE
    assert ran.value.status is Status.PASS, ran


def test_every_failure_is_one_outcome_from_the_child():
    def ref(name):
        return KernelRef.of(resolve(f"{HERE}:{name}"), f"{HERE}:{name}")

    case = _case(b=1, h=1)
    with KernelWorker(timeout=120) as worker:
        good = worker.run(KernelRef.of(naive, f"{HERE}:naive"), case, "cpu")
        assert good.ok and good.value.o.shape == (1, 1, 16, 16)
        err = worker.run(ref("raises"), case, "cpu")
        assert err.status is Status.ERROR and "ValueError: bad stride (at " in err.message
        assert worker.run(ref("declines"), case, "cpu") == Outcome.failed(
            Status.SKIP, "the backend takes no such shape"
        )
        bad = worker.run(ref("wrong_shape"), case, "cpu")
        assert (
            bad.status is Status.BAD_OUTPUT
            and "expected (B, Hq, Nq, dv) = (1, 1, 16, 16)" in bad.message
        )
        assert worker.restarts == 0  # a Python exception leaves the child as it is
        died = worker.run(ref("crashes"), case, "cpu")
        assert died == Outcome.failed(Status.ERROR, "the kernel process died (exit code 3)")
        assert worker.restarts == 1
        worker.run(KernelRef.of(naive, f"{HERE}:naive"), case, "cpu")  # a fresh child, warm
        worker.timeout = 2.0
        hung = worker.run(ref("hangs"), case, "cpu")
        assert hung == Outcome.failed(Status.TIMEOUT, "no result within 2 s")
        assert worker.restarts == 2


def test_a_spec_the_child_cannot_resolve_is_an_error_not_a_crash():
    ref = KernelRef(f"{HERE}:no_such_kernel", ())
    out = KernelWorker(isolate=False).run(ref, _case(), "cpu")
    assert out.status is Status.ERROR and "no attribute 'no_such_kernel'" in out.message


def test_a_kernel_ref_pickles_where_the_kernel_does_not():
    closure = flashcheck.kernel(lambda q, k, v: _naive(q, k, v), api="numpy", arithmetic="naive")
    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(closure)
    ref = KernelRef.of(replace(closure, batched=False), "naive-numpy")
    back = pickle.loads(pickle.dumps(ref))
    rebuilt = back.kernel()
    assert rebuilt.fn is resolve("naive-numpy").fn  # the functions come from the spec
    assert rebuilt.arithmetic == "naive" and rebuilt.batched is False
    assert rebuilt.pending == closure.pending and rebuilt.name == closure.name


def test_kernel_ref_arguments_are_checked():
    with pytest.raises(TypeError, match="takes a Kernel"):
        KernelRef.of("naive-numpy", "naive-numpy")
    with pytest.raises(ValueError, match="spec string"):
        KernelRef.of(naive, "")
    with pytest.raises(TypeError, match="KernelRef"):
        KernelWorker(isolate=False).run("naive-numpy", _case(), "cpu")
    with pytest.raises(ValueError, match=r"package\.module:function"):
        KernelWorker(isolate=False).check(
            "determinism", KernelRef.of(naive, "x"), _case(), "cpu", 1
        )


def test_an_outcome_is_a_value_or_the_reason_for_none():
    assert Outcome.returned(3).ok and Outcome.returned(3).value == 3
    with pytest.raises(ValueError, match="other than PASS"):
        Outcome.failed(Status.PASS, "x")
    with pytest.raises(ValueError, match="an Outcome's status"):
        Outcome(Status.FAIL_HARD)
    assert str(Outcome.failed("TIMEOUT", "no result")) == "TIMEOUT: no result"


def test_a_kernel_promises_nothing_it_does_not_declare():
    plain = Kernel("plain", _naive)
    declared = flashcheck.kernel(_naive)
    assert not plain.deterministic and not plain.batch_invariant
    assert (plain.deterministic, plain.batch_invariant) == (
        declared.deterministic,
        declared.batch_invariant,
    )


def _imports(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            yield "." * node.level + (node.module or "")
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("harness/adapters", ("..checks", "..campaign", "..bench", "..cli")),
        ("harness/judging", ("..adapters", "..checks", "..campaign")),
        ("properties", ("..harness.campaign",)),
    ],
)
def test_the_kernel_contracts_layer_imports_nothing_above_it(folder, forbidden):
    # judging/check.py, gradient_check.py and replay.py move up to checks/ (other work).
    moving = {"check.py", "gradient_check.py", "replay.py"}
    found = [
        f"{path.name}: {mod}"
        for path in (ROOT / folder).glob("*.py")
        if not path.name.startswith("test_") and path.name not in moving
        for mod in _imports(path)
        if mod.startswith(forbidden)
    ]
    assert not found


def test_reference_processes_yield_the_cores_to_the_kernel_workers():
    # The kernel workers feed the GPUs; the reference processes run at a lower priority so a
    # generation of references on every core does not delay a kernel call's host work.
    with LocalExecutor(workers=1, kernels=False) as pool:
        theirs = pool.submit(os.nice, 0).result()
    assert theirs == min(os.nice(0) + 10, 19)


@pytest.mark.serial  # times the close
def test_an_interrupted_close_returns_after_the_pools_manager_thread_has_ended():
    # Python 3.11's exit wakes the pool's manager thread through a pipe the thread closes as it
    # ends, unlocked (python/cpython#125451): an interrupted run that exited at that moment
    # printed "Bad file descriptor" after its "interrupted" line. close(interrupted=True) waits
    # for the thread, so the exit finds the pipe closed.
    pool = LocalExecutor(workers=1, kernels=False)
    manager = pool._pool._executor_manager_thread
    running = pool.submit(time.sleep, 60)
    deadline = time.monotonic() + 60
    while not running.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    pool.close(interrupted=True)
    assert time.monotonic() - t0 < 3
    assert manager is not None and not manager.is_alive()


def test_kernel_workers_see_the_gpus_their_campaign_was_given():
    # Started with CUDA_VISIBLE_DEVICES=2,3, the workers take GPUs 2 and 3, not 0 and 1.
    assert worker_gpus(2, "2,3") == ["2", "3"]
    assert worker_gpus(1, "1") == ["1"]
    assert worker_gpus(2, None) == ["0", "1"] == worker_gpus(2, "")
    assert worker_gpus(1, "GPU-8d1c2f3a, 1") == ["GPU-8d1c2f3a"]  # UUIDs as given
    assert worker_gpus(2, "3,1,-1,0") == ["3", "1"]  # CUDA stops at the invalid entry


def _kernel_children() -> list:
    import multiprocessing as mp

    return [p for p in mp.active_children() if p.name == "flashcheck-kernel"]


def test_a_standby_child_takes_over_after_a_crash_with_its_start_already_done():
    # A GPU worker keeps a second child started, so a replacement (after a crash, a timeout or
    # a CUDA error) does not put the imports on the campaign's critical path.
    case = _case(b=1, h=1)
    good = KernelRef.of(naive, f"{HERE}:naive")
    with KernelWorker(timeout=120, standby=True) as worker:
        assert worker.run(good, case, "cpu").ok
        assert len(_kernel_children()) == 2  # the one that ran, and its standby
        died = worker.run(KernelRef.of(resolve(f"{HERE}:crashes"), f"{HERE}:crashes"), case, "cpu")
        assert died == Outcome.failed(Status.ERROR, "the kernel process died (exit code 3)")
        needed = time.time()
        assert worker.run(good, case, "cpu").ok
        spawned, _ = worker.starts[-1]
        assert len(worker.starts) == 2 and spawned < needed  # started before it was needed
        assert len(_kernel_children()) == 2  # and a new standby behind it
    assert _kernel_children() == []  # closing stops both


def test_without_standby_a_worker_runs_one_child():
    with KernelWorker(timeout=120) as worker:
        assert worker.run(KernelRef.of(naive, f"{HERE}:naive"), _case(b=1, h=1), "cpu").ok
        assert len(_kernel_children()) == 1


def test_an_output_in_flash_attn_func_s_layout_is_named():
    from flashcheck.harness.adapters.kernel_output import KernelOutputError

    def bnhd(q, k, v, *, causal=False, scale=None):
        return np.swapaxes(np.asarray(q, np.float32), 1, 2)

    case = make_case(Recipe("fp32", "randn", 1, 2, 2, 8, 8, 4, 4, seed=0))
    with pytest.raises(KernelOutputError, match=r"expected \(B, Hq, Nq, dv\) = \(1, 2, 8, 4\) "):
        flashcheck.check(bnhd, case, save="never")
    with pytest.raises(
        KernelOutputError, match=r"swapped, as in flash_attn_func.s \(B, N, H, \.\.\.\)"
    ):
        flashcheck.check(bnhd, case, save="never")
    square = make_case(Recipe("fp32", "randn", 1, 2, 2, 2, 2, 4, 4, seed=0))
    with pytest.raises(KernelOutputError) as err:  # (B, N, H, d) is (B, H, N, d) here: no hint
        flashcheck.check(lambda q, k, v: np.zeros((1, 2, 2, 5), np.float32), square, save="never")
    assert "swapped" not in str(err.value)
