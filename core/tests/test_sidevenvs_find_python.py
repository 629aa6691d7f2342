"""``sidevenvs.find_python``: the interpreter a side environment that needs a newer Python is
built with. Fake interpreters are shell scripts answering the version probe, so no Python
3.12 is needed, except in the one test that runs the real one where pyenv has it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rllm_core.sidevenvs import InterpreterNotFound, find_python

WANTED = (3, 12)
WHAT = "harness:demo"
REAL_PYENV_312 = Path("/root/.pyenv/versions/3.12.1/bin/python3.12")


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def _python(path: Path, major: int, minor: int) -> Path:
    """A fake interpreter: answers ``-c "import sys; print(*sys.version_info[:2])"``."""
    return _script(path, f'echo "{major} {minor}"')


def _shim(folder: Path, name: str) -> Path:
    """A pyenv shim for ``name`` while pyenv's global version lacks it: it fails as pyenv's
    does."""
    message = (
        f"pyenv: {name}: command not found\n\n"
        f"The `{name}' command exists in these Python versions:\n  3.12.1\n\n"
        "Note: See 'pyenv help global' for tips on allowing multiple\n"
        "      Python versions to be found at the same time."
    )
    return _script(folder / name, f"cat >&2 <<'EOF'\n{message}\nEOF\nexit 127")


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """An empty PATH folder, a pyenv root with no versions yet, and a HOME of their own."""
    path = tmp_path / "bin"
    path.mkdir()
    root = tmp_path / "pyenv"
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("PATH", str(path))
    monkeypatch.setenv("PYENV_ROOT", str(root))
    monkeypatch.setenv("HOME", str(home))
    return {"path": path, "versions": root / "versions", "home": home}


# ------------------------------------------------------------------- an explicit interpreter


def test_an_explicit_interpreter_new_enough_is_returned_as_given(tmp_path):
    python = _python(tmp_path / "py", 3, 13)
    assert find_python(WANTED, str(python), what=WHAT) == str(python)


def test_an_explicit_interpreter_too_old_is_refused_naming_it_and_the_fix(tmp_path):
    python = _python(tmp_path / "py", 3, 11)
    with pytest.raises(InterpreterNotFound) as caught:
        find_python(WANTED, str(python), what=WHAT)
    message = str(caught.value)
    assert message.startswith(f"{WHAT} needs Python 3.12 or newer")
    assert f"the interpreter given, {python}, is Python 3.11" in message
    assert "point it at a python3.12 (or newer) executable" in message


def test_an_explicit_interpreter_that_fails_is_refused_with_its_first_error_line(tmp_path):
    # What a pyenv shim prints when the version it names is not the active one.
    python = _script(
        tmp_path / "py",
        'echo "pyenv: python3.12: command not found" >&2\n'
        'echo "Python versions to be found at the same time." >&2\nexit 127',
    )
    with pytest.raises(InterpreterNotFound) as caught:
        find_python(WANTED, str(python), what=WHAT)
    message = str(caught.value)
    assert (
        f"the interpreter given, {python}, failed: pyenv: python3.12: command not found" in message
    )
    assert "point it at a python3.12 (or newer) executable" in message


def test_an_explicit_interpreter_that_does_not_exist_is_refused_naming_it(tmp_path):
    missing = tmp_path / "no" / "python3.12"
    with pytest.raises(InterpreterNotFound) as caught:
        find_python(WANTED, str(missing), what=WHAT)
    message = str(caught.value)
    assert f"the interpreter given, {missing}, could not run:" in message
    assert "point it at a python3.12 (or newer) executable" in message


def test_an_explicit_interpreter_is_not_replaced_by_one_found(host):
    _python(host["path"] / "python3.12", 3, 12)
    _python(host["versions"] / "3.12.1" / "bin" / "python3.12", 3, 12)
    with pytest.raises(InterpreterNotFound, match=r"is Python 3\.10"):
        find_python(WANTED, str(_python(host["home"] / "old", 3, 10)), what=WHAT)


# ------------------------------------------------------------------------ PATH and pyenv


def test_a_failing_pyenv_shim_on_path_is_passed_over_for_pyenvs_versions_folder(host):
    _shim(host["path"], "python3.12")
    real = _python(host["versions"] / "3.12.1" / "bin" / "python3.12", 3, 12)
    assert find_python(WANTED, what=WHAT) == str(real)


@pytest.mark.skipif(
    not os.access(REAL_PYENV_312, os.X_OK), reason=f"needs a real Python 3.12 at {REAL_PYENV_312}"
)
def test_a_real_interpreter_in_pyenvs_versions_folder_is_found_past_a_shim(host):
    _shim(host["path"], "python3.12")
    linked = host["versions"] / "3.12.1" / "bin" / "python3.12"
    linked.parent.mkdir(parents=True)
    linked.symlink_to(REAL_PYENV_312)
    assert find_python(WANTED, what=WHAT) == str(linked)


def test_pyenvs_folder_under_home_serves_when_pyenv_root_is_unset(host, monkeypatch):
    monkeypatch.delenv("PYENV_ROOT")
    python = _python(host["home"] / ".pyenv" / "versions" / "3.13.0" / "bin" / "python3.13", 3, 13)
    assert find_python(WANTED, what=WHAT) == str(python)


def test_a_working_interpreter_on_path_comes_before_pyenvs_folder(host):
    on_path = _python(host["path"] / "python3.13", 3, 13)
    _python(host["versions"] / "3.12.1" / "bin" / "python3.12", 3, 12)
    assert find_python(WANTED, what=WHAT) == str(on_path)


def test_the_oldest_qualifying_minor_on_path_is_preferred(host):
    for minor in (14, 13, 12):
        _python(host["path"] / f"python3.{minor}", 3, minor)
    assert find_python(WANTED, what=WHAT) == str(host["path"] / "python3.12")


def test_the_oldest_qualifying_minor_in_pyenv_is_preferred_its_newest_patch_first(host):
    for version in ("3.14.0", "3.13.0", "3.12.9", "3.12.10", "3.11.7", "2.7.18"):
        major, minor = map(int, version.split(".")[:2])
        name = f"python{major}.{minor}"
        _python(host["versions"] / version / "bin" / name, major, minor)
    (host["versions"] / "system").mkdir()
    found = find_python(WANTED, what=WHAT)
    assert found == str(host["versions"] / "3.12.10" / "bin" / "python3.12")


def test_a_candidate_older_than_its_name_says_is_passed_over(host):
    _python(host["path"] / "python3.12", 3, 11)
    newer = _python(host["path"] / "python3.13", 3, 13)
    assert find_python(WANTED, what=WHAT) == str(newer)


# -------------------------------------------------------------------------- none found


def test_nothing_found_names_every_candidate_tried_and_how_to_install_one(host):
    shim = _shim(host["path"], "python3.12")
    old = _python(host["path"] / "python3.13", 3, 11)
    _python(host["versions"] / "3.11.7" / "bin" / "python3.11", 3, 11)
    with pytest.raises(InterpreterNotFound) as caught:
        find_python(WANTED, what=WHAT)
    message = str(caught.value)
    assert message.startswith(f"{WHAT} needs Python 3.12 or newer, and none was found: tried ")
    assert "python3.14 (not on PATH)" in message
    assert f"{shim} (failed: " in message
    assert f"{old} (is Python 3.11)" in message
    assert "pyenv's versions folder (no Python 3.12 or newer there)" in message
    assert "`pyenv install 3.12`" in message
    assert "`uv python install 3.12`" in message
    assert "python3.12 package) or give its path" in message


def test_nothing_at_all_lists_each_name_looked_for(host):
    with pytest.raises(InterpreterNotFound) as caught:
        find_python(WANTED, what=WHAT)
    message = str(caught.value)
    for minor in (12, 13, 14):
        assert f"python3.{minor} (not on PATH)" in message
    assert "pyenv's versions folder (no Python 3.12 or newer there)" in message


def test_a_pyenv_version_that_fails_is_named_with_its_error(host):
    broken = _script(
        host["versions"] / "3.12.1" / "bin" / "python3.12", 'echo "bad magic" >&2\nexit 1'
    )
    with pytest.raises(InterpreterNotFound) as caught:
        find_python(WANTED, what=WHAT)
    assert f"{broken} (failed: bad magic)" in str(caught.value)
