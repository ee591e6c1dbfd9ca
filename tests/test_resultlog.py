"""The results file of a campaign: durable appends, a torn last line dropped, another
campaign's configuration refused."""

import json
from pathlib import Path

import pytest

from flashcheck.harness.core.resultlog import ResultLog, ResultLogError, read_records


def test_results_file_survives_a_torn_write(tmp_path):
    path = tmp_path / "r.jsonl"
    header = {"type": "header", "config": {"a": 1}}
    with ResultLog.open(path, header) as log:
        log.append({"type": "result", "key": "x", "score": float("inf"), "m": float("nan")})
    with open(path, "ab") as f:
        f.write(b'{"type": "result", "key": "y", "sco')  # killed mid-write
    with ResultLog.open(path, header) as log:
        assert [r.get("key") for r in log.records[1:]] == ["x"]
        assert log.records[1]["score"] == "inf" and log.records[1]["m"] == "nan"
    assert Path(path).read_bytes().endswith(b"}\n")
    with pytest.raises(ResultLogError, match="another configuration") as err:
        ResultLog.open(path, {"type": "header", "config": {"a": 2}})
    assert "a: 1 on file, 2 now" in str(err.value)  # the setting that differs, by name
    with pytest.raises(ResultLogError, match="another configuration") as err:
        ResultLog.open(path, {"type": "header", "config": {"a": 1, "parts": ["options"]}})
    # (a setting not given is the default, not "None")
    assert "parts: the default on file, ['options'] now" in str(err.value), err.value
    (tmp_path / "junk.jsonl").write_text("not json\n")
    with pytest.raises(ResultLogError):
        read_records(tmp_path / "junk.jsonl")
    assert json.loads(path.read_text().splitlines()[0])["schema"] == "flashcheck-results/1"


def test_check_resumable_says_what_open_would_refuse(tmp_path):
    path = tmp_path / "r.jsonl"
    header = {"type": "header", "config": {"a": 1}}
    ResultLog.check_resumable(path, header)  # no file yet: nothing to refuse
    ResultLog.open(path, header).close()
    ResultLog.check_resumable(path, header)
    with pytest.raises(ResultLogError, match="a: 1 on file, 2 now"):
        ResultLog.check_resumable(path, {"type": "header", "config": {"a": 2}})
    ResultLog.check_resumable(path, {"type": "header", "config": {"a": 2}}, fresh=True)
    (tmp_path / "junk.jsonl").write_text('{"type": "header"}\n')
    with pytest.raises(ResultLogError, match="not a flashcheck results file"):
        ResultLog.check_resumable(tmp_path / "junk.jsonl", header)
