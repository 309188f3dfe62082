"""softcapgrad engines (list, install, remove) and parity's refusals before running, each one line and exit 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from softcapgrad.cli.app import app

pytest.importorskip("transformers")


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_the_listing_says_each_engines_state(cache):
    result = CliRunner().invoke(app, ["engines", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["engine"]: r for r in json.loads(result.output)["rows"]}
    assert rows["transformers"]["state"] == "installed" and rows["transformers"]["environment"] == "main"
    assert rows["transformers-4"]["state"] == "not installed"
    assert rows["transformers-4"]["path"].startswith(str(cache / "softcapgrad" / "engines" / "transformers-4-"))


def test_parity_with_an_engine_not_installed_names_the_command(cache):
    result = CliRunner().invoke(app, ["parity", "--engine", "transformers-4"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "softcapgrad: error: engine transformers-4: its environment transformers-4 is not installed: "
        "softcapgrad engines install transformers-4 (or parity --install)"]


def test_an_unknown_engine_is_refused(cache):
    for command in (["parity", "--engine", "nosuch"], ["engines", "install", "nosuch"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
        assert "nosuch" in result.output


def test_removing_what_is_not_there_says_so(cache):
    result = CliRunner().invoke(app, ["engines", "remove", "onnx", "transformers"])
    assert result.exit_code == 0
    assert "onnx: was not installed." in result.output and "main: softcapgrad's own, kept." in result.output


def test_parity_that_knows_nothing_can_run_exits_2(cache):
    """Keras Hub's registry holds no VaultGemma: before building anything, one line and exit 2."""
    result = CliRunner().invoke(app, ["parity", "--model-type", "vaultgemma", "--engine", "kerashub"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "softcapgrad: error: no engine asked for has the architecture vaultgemma (kerashub converts gemma2, "
        "gemma3_text): nothing to run"]
