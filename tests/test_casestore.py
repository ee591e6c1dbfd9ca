import json

import numpy as np
import pytest

from flashcheck.harness.cases.case import Case
from flashcheck.harness.cases.store import CaseFileError, case_id, load_case, save_case
from flashcheck.properties.strategies import Recipe, make_case


def _case(dtype="bf16"):
    return make_case(
        Recipe(dtype, "fa3_outliers", 1, 2, 1, 5, 7, 8, 3, seed=3, causal=True, mask_density=0.5)
    )


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_round_trip_is_bit_exact(tmp_path, dtype):
    case = _case(dtype)
    cid = save_case(
        case, kernel="triton", device="cpu", verdict={"verdict": "FAIL"}, directory=tmp_path
    )
    back, rec = load_case(cid, tmp_path)
    for name in ("q", "k", "v"):
        assert np.array_equal(case.bits(name), back.bits(name))
    assert np.array_equal(case.mask, back.mask)
    assert back.causal and rec["kernel"] == "triton" and rec["verdict"]["verdict"] == "FAIL"
    assert rec["environment"]["numpy"] == np.__version__
    assert cid == case_id(back, "triton")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{cid}.json", f"{cid}.npz"]


def test_same_failure_same_id_and_no_temp_files(tmp_path):
    a = save_case(_case(), kernel="x", device="cpu", directory=tmp_path)
    b = save_case(_case(), kernel="x", device="cpu", directory=tmp_path)
    assert a == b and len(list(tmp_path.iterdir())) == 2
    assert save_case(_case(), kernel="y", device="cpu", directory=tmp_path) != a


def test_corrupted_and_foreign_files_are_refused(tmp_path):
    cid = save_case(_case(), kernel="x", device="cpu", directory=tmp_path)
    npz = tmp_path / f"{cid}.npz"
    data = bytearray(npz.read_bytes())
    data[-10] ^= 0xFF
    npz.write_bytes(bytes(data))
    with pytest.raises(CaseFileError, match="checksum"):
        load_case(cid, tmp_path)
    (tmp_path / "foreign.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(CaseFileError, match="not a flashcheck case file"):
        load_case("foreign", tmp_path)
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(CaseFileError, match="invalid JSON"):
        load_case("junk", tmp_path)
    with pytest.raises(CaseFileError, match="no case file"):
        load_case("0123456789abcdef", tmp_path)
    (tmp_path / f"{cid}.npz").unlink()
    with pytest.raises(CaseFileError, match="missing"):
        load_case(cid, tmp_path)


def test_case_validation_and_repr():
    with pytest.raises(ValueError, match="one dtype"):
        Case(np.zeros((1, 1, 1, 1), np.float64), np.zeros((1, 1, 1, 1)), np.zeros((1, 1, 1, 1)))
    c = _case()
    assert repr(c).startswith("make_case(Recipe(dtype='bf16', family='fa3_outliers'")
    small = Case(*(np.ones((1, 1, 1, 1), np.float16),) * 3)
    assert "0x3c00" in repr(small)


def test_an_id_saved_by_a_report_is_found_in_its_folder(tmp_path, monkeypatch):
    # `flashcheck report` saves its cases in reports/<name>/cases: `flashcheck replay <id>`
    # finds them there when no --dir is given (and nothing else holds that id).
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLASHCHECK_CASE_DIR", raising=False)
    cid = save_case(_case(), kernel="x", device="cpu", directory=tmp_path / "reports/r1/cases")
    _, record = load_case(cid)
    assert record["id"] == cid
    with pytest.raises(CaseFileError, match="no case file"):
        load_case(cid, tmp_path / "elsewhere")  # a directory given is the only place looked
    # Saved by two reports: both named, not "no case file" (the message said to pass an id
    # saved under reports/<name>/cases, which it was).
    save_case(_case(), kernel="x", device="cpu", directory=tmp_path / "reports/r2/cases")
    with pytest.raises(CaseFileError, match=r"saved by 2 reports \(reports/r1/cases, reports/r2"):
        load_case(cid)
    assert load_case(cid, "reports/r2/cases")[1]["id"] == cid


def test_one_case_failing_two_properties_is_two_files_each_replaying_its_own(tmp_path):

    case = make_case(Recipe("fp16", "randn", 1, 1, 1, 4, 4, 8, 8, 0))
    ids = {
        prop: save_case(
            case, kernel="k", device="cpu", context={"property": prop}, directory=tmp_path
        )
        for prop in ("accuracy", "gradients", "options-applied")
    }
    assert len(set(ids.values())) == 3
    assert ids["accuracy"] == case_id(case, "k")  # accuracy cases keep their ids
    for prop, cid in ids.items():
        assert load_case(cid, tmp_path)[1]["context"]["property"] == prop
