"""engines/releases/light.py: the one way a light environment's pins are found, for every package it builds.

pip is never run here: the resolver's step is replaced by one that records what it was asked and writes the report a
dry run writes, so each test checks what would be asked and what would be pinned."""

import json

import pytest

from softcapgrad.core.checks import InputError
from softcapgrad.engines.environments import environments
from softcapgrad.engines.releases import light, releases


@pytest.fixture
def resolver(monkeypatch):
    """The dry run's step, faked: the names it was asked for, and a report installing ``found``."""
    asked: list = []
    found = {"keras": "3.15.1", "tensorflow-cpu": "2.21.0", "six": "1.17.0"}

    def step(cmd, where, say, label, count):
        assert cmd[1:6] == ["-m", "pip", "install", "--dry-run", "--quiet"], cmd
        asked.append(cmd[8:])
        report = {"install": [{"metadata": {"name": k, "version": v}} for k, v in found.items()]}
        (where / "report.json").write_text(json.dumps(report), encoding="utf-8")

    monkeypatch.setattr(environments, "_step", step)
    return asked, found


def test_a_package_alone_is_pinned_without_the_resolver(resolver, tmp_path):
    asked, _ = resolver
    assert light.WITHOUT_DEPS["unsloth-zoo"] == ()
    assert light.pins("unsloth-zoo", "2026.4.6", tmp_path) == {"unsloth-zoo": "2026.4.6"}
    assert asked == []


def test_a_package_without_its_deps_resolves_only_its_companions(resolver, tmp_path):
    asked, found = resolver
    assert light.pins("keras-nlp", "0.14.1", tmp_path) == {**found, "keras-nlp": "0.14.1"}
    assert asked == [list(light.WITHOUT_DEPS["keras-nlp"])]  # the release itself is not handed to the resolver


def test_any_other_package_is_resolved_with_its_deps(resolver, tmp_path):
    asked, found = resolver
    assert light.pins("transformers", "4.44.2", tmp_path) == found  # the resolver's answer, as it gives it
    assert asked == [["transformers==4.44.2"]]


def test_every_package_lives_in_one_folder_scheme(tmp_path):
    assert light.folder("keras-nlp", "0.14.1", tmp_path) == tmp_path / "keras-nlp-0.14.1"
    assert releases.folder("4.44.2", tmp_path) == light.folder("transformers", "4.44.2", tmp_path)
    assert light.state("unsloth-zoo", "2026.4.6", tmp_path).state == "not installed"
    with pytest.raises(InputError, match="digits and dots"):
        light.folder("keras-nlp", "0.14.1; rm", tmp_path)
