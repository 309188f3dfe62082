"""Text model types the shrunk defaults did not build, audited through their family's overrides and feeds; and the
layer cut's handling of a per-layer list of layer indices (each layer naming the layer whose cache it reads)."""

import pytest

from softcapgrad.models import tiny


def test_a_list_of_layer_indices_is_cut_by_kind_and_renumbered():
    # every layer names another or itself: by value all six differ, by kind there are three
    # (owns its cache and lends it, reuses another's, owns it alone)
    d = {"num_hidden_layers": 6, "kv_source_layers": [0, 0, 2, 2, 4, 5], "layer_types": ["a"] * 6}
    out = tiny.shrink(d)
    assert out["num_hidden_layers"] == 3
    assert out["kv_source_layers"] == [0, 0, 2]  # layers 0, 1 and 4 kept, renumbered 0, 1, 2
    # a reuse points at an earlier kept layer that owns its cache, as the configuration classes check
    assert all(v <= i and out["kv_source_layers"][v] == v for i, v in enumerate(out["kv_source_layers"]))


def test_a_flag_list_is_still_compared_by_value():
    # 0/1 flags name layer 1 at layer 0 (a later layer): not a list of layer indices
    out = tiny.shrink({"num_hidden_layers": 8, "no_rope_layers": [1, 1, 1, 0] * 2})
    assert out["num_hidden_layers"] == 2 and out["no_rope_layers"] == [1, 0]


def test_a_reused_layer_keeps_the_layer_it_reads():
    out = tiny.shrink({"num_hidden_layers": 6, "kv_source_layers": [0, 1, 2, 3, 4, 3], "layer_types": ["a"] * 6})
    # kinds: own alone (0), own and lent (3), reuses (5): layer 5's source, 3, is kept with it
    assert out["num_hidden_layers"] == 3
    assert out["kv_source_layers"] == [0, 1, 1]


def test_mistral_large4_keeps_one_layer_of_each_kind_not_all_72():
    pytest.importorskip("transformers")
    text = tiny.tiny_dict("mistral_large4")["text_config"]
    assert text["num_hidden_layers"] == 3  # dense + rope, sparse + rope, sparse + no rope
    assert text["kv_source_layers"] == [0, 1, 2]


@pytest.mark.parametrize("model_type, gates", [
    ("dots1", {("model.layers.*.mlp.gate", "sigmoid")}),  # the router's sigmoid scores
    ("hrm_text", {("model.L_module.layers.*.self_attn", "sigmoid"), ("model.H_module.layers.*.self_attn", "sigmoid")}),
])
def test_repaired_text_model_types_audit(model_type, gates):
    pytest.importorskip("transformers")
    from softcapgrad.models import census

    candidate = next(c for c in census.candidates() if c.model_type == model_type)
    row = census.census_row(candidate)
    assert row.status == "audited", row.reason
    assert row.implementations == {"eager": "ran", "sdpa": "ran"}
    assert {(g["module"], g["fn"]) for g in row.gates if g["kind"] == "gate"} == gates
    assert any("(override)" in c for c in row.changes)
