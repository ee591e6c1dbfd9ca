import pytest

from flashcheck.harness.cli import environment, main


def test_formats_table(capsys):
    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    assert "| fp16 | 11 | -14 | 15 | 2^-11 | 65504 |" in out


def test_env_lists_numerically_relevant_versions(capsys):
    assert main(["env"]) == 0
    env = environment()
    assert env["mpmath backend"] in ("gmpy", "python", "sage")
    assert "numpy" in capsys.readouterr().out


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "usage: flashcheck" in capsys.readouterr().out


def test_version_flag():
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
