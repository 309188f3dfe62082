"""ESMFold2 built tiny through the text family's overrides and fed a protein per row: its atom bundle, and its
audit."""

import pytest


def test_the_protein_feed_bundles_each_residues_heavy_atoms_padded_to_the_longest_row():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers.models.esmfold2")
    from transformers.models.esmfold2.protein_utils import PROTEIN_1TO3, PROTEIN_HEAVY_ATOMS

    from softcapgrad.models.families import text

    ids = torch.tensor([[0, 5, 7], [18, 18, 1]])  # A G I and W W C (id mod 20 of the 20 amino acids)
    fed = text._protein(None, None, ids, torch.Generator().manual_seed(0))
    atoms = fed["atom_inputs"]
    letters = [["ACDEFGHIKLMNPQRSTVWY"[int(i) % 20] for i in row] for row in ids]
    heavy = [[len(PROTEIN_HEAVY_ATOMS[PROTEIN_1TO3[c]]) for c in row] for row in letters]
    # A G I: 5 + 4 + 8 heavy atoms, 32 slots; W W C: 14 + 14 + 6, 64 slots (the featurizer pads to a multiple of
    # 32), so the first row is padded to 64 as well
    assert heavy == [[5, 4, 8], [14, 14, 6]]
    assert atoms.atom_attention_mask.sum(dim=1).tolist() == [17, 34]
    assert atoms.ref_pos.shape == (2, 64, 3) and atoms.ref_atom_name_chars.shape == (2, 64, 4)
    for b, counts in enumerate(heavy):  # each valid atom points at its own token, in order
        valid = atoms.atom_to_token[b][atoms.atom_attention_mask[b]]
        assert valid.tolist() == [t for t, n in enumerate(counts) for _ in range(n)]
    assert fed["res_type"].shape == ids.shape and fed["token_bonds"].shape == (2, 3, 3, 1)
    assert "distogram_atom_idx" not in fed


def test_esmfold2_audits_with_the_trunks_triangle_gates():
    pytest.importorskip("transformers.models.esmfold2")
    from softcapgrad.models import census

    candidate = next(c for c in census.candidates() if c.model_type == "esmfold2")
    row = census.census_row(candidate)
    assert row.status == "audited", row.reason
    assert row.implementations == {"eager": "ran", "sdpa": "ran"}
    gates = {(g["module"], g["fn"]) for g in row.gates if g["kind"] == "gate"}
    # each triangle update gates its output by a sigmoid of its input, in the trunk and its coda alike
    assert {("folding_trunk.layers.*.tri_mul_out", "sigmoid"), ("folding_trunk.layers.*.tri_mul_in", "sigmoid"),
            ("parcae.output_stack.layers.*.tri_mul_out", "sigmoid")} <= gates
    # the diffusion noise cap is a sampler setting, not a tanh of the trunk's forward
    assert [(c["field"], c["status"]) for c in row.caps] == [("structure_head.inference_sigma_cap", "no head here")]
