"""The per-family tables of overrides and inputs: one family per model type, real model types only, and no
override that sets a cap (an override repairs a shrunk configuration; it never decides the figure a row reports)."""

import pytest

from softcapgrad.models import families


def test_a_model_type_sits_in_one_family_only():
    for table in ("OVERRIDES", "INPUTS"):
        seen: dict = {}
        for family in families.FAMILIES:
            for model_type in getattr(family, table):
                assert model_type not in seen, (table, model_type, seen.get(model_type), family.__name__)
                seen[model_type] = family.__name__


def test_every_entry_names_a_model_type_of_the_installed_transformers():
    pytest.importorskip("transformers")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    unknown = sorted(t for t in (*families.OVERRIDES, *families.INPUTS) if t not in CONFIG_MAPPING_NAMES)
    assert unknown == []


def test_no_override_sets_a_cap_or_a_gate_switch():
    capped = sorted(f"{t}: {field}" for t, fields in families.OVERRIDES.items() for field in fields
                    if "softcap" in field.lower() or field.rsplit(".", 1)[-1].startswith(("use_gate", "gate_")))
    assert capped == []
