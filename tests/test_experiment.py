"""softcapgrad experiment: bad input before training, the task and statistics, and the --quick run itself
(its JSON's structure, the dead zone where the design puts it, none where an arm's own first zero is not
reached, and two runs byte for byte the same)."""

import json

import numpy as np
import pytest

from softcapgrad.experiments import stats
from softcapgrad.experiments.task import Task, batch, mapping

pytest.importorskip("transformers")


@pytest.mark.parametrize("args, needle", [
    (("--steps", "0"), "--steps"), (("--seeds", "0"), "--seeds"), (("--arm", "bf17-eager"), "--arm"),
    (("--depth", "0"), "--depth"), (("--depth", "-2"), "--depth"), (("--model", "no-such-dir"), "--model"),
    (("--depth", "1e300"), "--depth"), (("--depth", "nan"), "--depth"), (("--shift", "sideways"), "--shift"),
])
def test_bad_input_is_one_line_before_training(cli, tmp_path, args, needle):
    code, _, out, err = cli("experiment", *args, "--out", str(tmp_path))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err
    assert list(tmp_path.iterdir()) == []


def test_model_directory_with_pickled_weights_only_is_refused(cli, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma2"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not opened")
    code, _, _, err = cli("experiment", "--model", str(tmp_path), "--out", "none")
    assert code == 2 and "safetensors" in err and len(err.strip().splitlines()) == 1


def test_a_model_too_big_for_memory_is_refused_in_one_line(cli, tmp_path, monkeypatch):
    from softcapgrad.models import tiny

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma2", "final_logit_softcapping": 30.0}))
    from safetensors.numpy import save_file

    save_file({}, str(tmp_path / "model.safetensors"))  # a valid file, its header read before the size is judged
    monkeypatch.setattr(tiny, "available_bytes", lambda: 1 << 20)
    code, _, _, err = cli("experiment", "--model", str(tmp_path), "--out", "none")
    assert code == 2 and "cannot run here" in err and len(err.strip().splitlines()) == 1


def test_a_saved_model_runs_the_same_measurement(cli, tmp_path):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                          final_logit_softcapping=30.0, attn_logit_softcapping=50.0)
    Gemma2ForCausalLM(config).save_pretrained(tmp_path / "m", safe_serialization=True)
    code, data, _, err = cli("experiment", "--model", str(tmp_path / "m"), "--quick", "--seeds", "1", "--steps", "3",
                             "--arm", "bf16-eager", "--arm", "bf16-patch", "--depth", "1", "--shift", "rotation",
                             "--out", "none", "--json")
    assert code == 0, err
    assert data["params"]["model"].startswith("Gemma2ForCausalLM from m")
    assert {r["arm"] for r in data["rows"]} == {"bf16-eager", "bf16-patch"}


def test_interrupt_writes_nothing_and_says_so(cli, tmp_path, monkeypatch):
    from softcapgrad.experiments import runner

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "measure", interrupted)
    code, _, _, err = cli("experiment", "--quick", "--out", str(tmp_path))
    assert code == 130 and "no file was written" in err and list(tmp_path.iterdir()) == []


def test_the_shift_changes_exactly_the_shifted_tokens():
    task = Task(vocab=64, seq=8, batch=4, shift_fraction=0.25)
    m = mapping(task, 3)
    assert sorted(m.before) == list(range(64)) and sorted(m.after) == list(range(64))  # both permutations
    assert np.all((m.before != m.after) == m.shifted) and m.shifted.sum() == 16
    assert np.array_equal(batch(task, 3, 1, 5), batch(task, 3, 1, 5))
    assert not np.array_equal(batch(task, 3, 1, 5), batch(task, 3, 1, 6))


def test_ratio_interval_and_verdicts():
    assert stats.ratio([10] * 5, [10] * 5, 200, 0.95, 0).verdict == "no measurable difference"
    slower = stats.ratio([30, 32, 31, 29, 33], [10, 11, 9, 10, 12], 500, 0.95, 0)
    assert slower.verdict == "bf16 eager slower" and slower.low > 1
    assert stats.ratio([5, 6, 5], [20, 21, 22], 500, 0.95, 0).verdict == "bf16 eager faster"
    assert stats.ratio([3, 9, 4], [5, 4, 8], 300, 0.95, 1) == stats.ratio([3, 9, 4], [5, 4, 8], 300, 0.95, 1)
    s = stats.summary([None, 5, None], 100)
    assert s.counted == [100, 5, 100] and s.median == 100 and s.censored and s.recovered == 1


@pytest.fixture(scope="module")
def quick(tmp_path_factory, cli):
    first, second = tmp_path_factory.mktemp("one"), tmp_path_factory.mktemp("two")
    # the quick design with 25 steps after the shift, not 100, the three arms the paired ratios compare, the
    # rotation shift and two depths, one under the bf16 first zero and one past it: every assertion below is about
    # the shift itself, the structure and the bytes (a run not recovered by then is censored at 25, which the
    # statistics take as it is); a partial run leaves out the SGD setting and the natural-confidence run
    args = ("--quick", "--steps", "25", "--arm", "bf16-eager", "--arm", "bf16-patch", "--arm", "bf16-patch-deadzone",
            "--depth", "0.5", "--depth", "4", "--shift", "rotation", "--json")
    runs = [cli("experiment", *args, "--out", str(folder)) for folder in (first, second)]
    return runs, first, second


@pytest.mark.slow
def test_quick_run_structure(quick):
    code, data, _, _ = quick[0][0]
    assert code == 0 and data["command"] == "experiment" and data["answer"]
    res = json.loads((quick[1] / "experiment.json").read_text())
    d = res["design"]
    assert res["quick"] is True and len(d["seeds"]) >= 2 and res["sgd"] is None and res["natural"] is None
    for arm in d["arms"]:
        for depth in d["depths"]:
            e = res["arms"][arm]["rotation"][f"{depth:g}x"]
            assert len(e["steps"]) == len(d["seeds"])
            assert e["low"] <= e["median"] <= e["high"]
            assert set(e["at_shift"]) == {"final logits", "attention"}
    assert [r["depth"] for r in res["paired"]] == d["depths"]
    for r in res["paired"]:
        for kind in ("total", "dead_zone", "rounding"):
            p = r[kind]
            assert p["low"] <= p["geomean"] <= p["high"] and p["slower"] + p["tied"] + p["faster"] == len(d["seeds"])
            assert "no difference" not in p["verdict"] and "measurable" not in p["verdict"]
    assert {"torch", "transformers", "cpu_capability", "seeds"} <= set(res["provenance"])
    assert (quick[1] / "figures" / "experiment.png").stat().st_size > 0
    assert "## Design, fixed before the results" in (quick[1] / "experiment.md").read_text()


def test_dead_zone_in_bf16_eager_and_none_below_each_arms_own_first_zero(quick):
    res = json.loads((quick[1] / "experiment.json").read_text())
    horizon = res["horizon"]
    for arm in ("bf16-eager", "bf16-patch-deadzone"):
        for key, e in res["arms"][arm]["rotation"].items():
            if float(key[:-1]) >= 1:
                assert arm != "bf16-eager" or e["at_shift"]["final logits"]["zero_grad_fraction"] > 0  # monitor sees it
                assert all(f > 0 for f in e["hook_zero_grad_fraction"])  # autograd sees the zeros
                assert all(0 < m < 1 for m in e["mass_lost_at_shift"])  # and some exact gradient mass goes with them
                assert all(a >= horizon for a in e["hook_largest"])
    patched = res["arms"]["bf16-patch"]["rotation"]
    own = res["first_zero"]["bf16-patch"]["value"]
    for e in patched.values():
        for largest, zero, lost in zip(e["hook_largest"], e["hook_zero_grad_fraction"], e["mass_lost_at_shift"]):
            if largest < own:
                assert zero == 0.0 and lost == 0.0
    below = res["paired"][0]  # 0.5×: no final logit dead, so the control's backward is the patch's bit for bit
    assert below["depth"] < 1 and below["dead_zone"]["tied"] == len(res["design"]["seeds"])
    assert below["fidelity"]["bf16-patch-deadzone"]["relative_error"] == [0.0] * len(res["design"]["seeds"])


def test_quick_run_is_byte_identical_twice(quick):
    _, first, second = quick
    for name in ("experiment.json", "experiment.md", "figures/experiment.png"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_a_quick_run_does_not_replace_a_full_one_without_force(cli, quick, tmp_path):
    from softcapgrad.experiments.design import DESIGN, TINY

    full = json.loads((quick[1] / "experiment.json").read_text())
    full["quick"], full["model"] = False, TINY
    full["design"].update(seeds=list(DESIGN.seeds), arms=list(DESIGN.arms), depths=list(DESIGN.depths),
                          shifts=list(DESIGN.shifts))
    text = json.dumps(full)
    (tmp_path / "experiment.json").write_text(text)
    for extra in ((), ("--seeds", "1"), ("--arm", "bf16-eager")):
        code, _, out, err = cli("experiment", "--quick", *extra, "--out", str(tmp_path))
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "--force" in err
        assert (tmp_path / "experiment.json").read_text() == text and sorted(p.name for p in tmp_path.iterdir()) \
            == ["experiment.json"]


def test_a_model_with_nan_weights_is_refused_before_training(cli, tmp_path):
    import torch
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=1, num_key_value_heads=1, head_dim=16, max_position_embeddings=32,
                          final_logit_softcapping=30.0, attn_logit_softcapping=50.0)
    model = Gemma2ForCausalLM(config)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    code, _, out, err = cli("experiment", "--model", str(tmp_path / "m"), "--quick", "--out", "none")
    (line,) = err.strip().splitlines()  # one line: no "Loading weights" bar of transformers' before it
    assert code == 2 and out == "" and "NaN" in line and "up_proj" in line


@pytest.mark.parametrize("vocab, caps", [(128, {"final_logit_softcapping": 30, "attn_logit_softcapping": 50}),
                                         (8, {})], ids=["caps written as integers", "vocabulary below the sequence"])
def test_a_saved_model_with_integer_caps_or_a_small_vocabulary_runs(cli, tmp_path, vocab, caps):
    """config.json may write a cap as 30 (the reader's own config is loaded, not the file again); a vocabulary
    of 8 is shorter than the task's 32-token sequence: the probe repeats it to fill a row."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=1, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                          final_logit_softcapping=30.0, attn_logit_softcapping=50.0)
    Gemma2ForCausalLM(config).save_pretrained(tmp_path / "m", safe_serialization=True)
    written = tmp_path / "m" / "config.json"
    written.write_text(json.dumps({**json.loads(written.read_text()), **caps}))
    code, data, _, err = cli("experiment", "--model", str(tmp_path / "m"), "--quick", "--seeds", "1", "--steps", "2",
                             "--arm", "bf16-eager", "--depth", "1", "--shift", "rotation", "--out", "none", "--json")
    assert code == 0, err
    assert data["params"]["model"].startswith("Gemma2ForCausalLM from m")
    assert [r["arm"] for r in data["rows"]] == ["bf16-eager"]


def test_help_says_what_seeds_accepts(cli):
    code, _, out, _ = cli("experiment", "--help", env={"COLUMNS": "200"})
    line = next(x for x in out.splitlines() if "--seeds" in x)
    assert code == 0 and "at least 1" in line and "0, 1" not in line
