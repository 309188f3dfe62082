"""parity --train: planted failures, each one named by the training check.

Each planted route is parity's tiny Gemma 2 (caps bound) trained one step in fp32 by the adapter's own
step function, in this process, with one thing changed: a cap whose gradient is straight-through, detached
or computed in bf16 under an fp32 forward; the final cap applied in the loss but not in the returned
logits; the caps' values swapped. The unchanged model is the control: both caps applied.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import types

import numpy as np
import pytest

pytest.importorskip("transformers")

from softcapgrad.engines.forward import catalog, modeltypes  # noqa: E402
from softcapgrad.engines.forward import reference as ref  # noqa: E402
from softcapgrad.engines.training import reference as tr  # noqa: E402
from softcapgrad.engines.training import verdict as tv  # noqa: E402
from softcapgrad.models import audit  # noqa: E402


def verdict_ratio() -> float:
    return tv.verdict.RATIO


def _adapter(name: str = "train_transformers"):
    """The adapter script as a module (its siblings on the path, as the runner's child has them)."""
    sys.path += [str(p) for p in catalog.ADAPTER_PATH if str(p) not in sys.path]
    spec = importlib.util.spec_from_file_location(f"adapter_{name}", catalog.script(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bound(tmp_path_factory):
    src = audit.source(None, modeltypes.model_type("gemma2"), ref.tiny_sets("gemma2"))
    model = ref.build(src, 0)
    ids = audit.random_ids(src.config, 1, 16, 0).numpy().reshape(-1)
    scales = ref.bind(model, ids)
    reference = tr.train_reference(model, ids, scales, {"attention": True, "final": True})
    return model, ids, reference, _adapter(), tmp_path_factory.mktemp("steps")


def _trained(bound, model) -> tr.Step:
    """One fp32 step of ``model`` by the adapter's loop, written and read back as a route's file is."""
    _, ids, _, adapter, folder = bound
    kept = adapter.step(model, model.get_output_embeddings(), ids, False, False, folder)
    np.savez(folder / "step.npz", **adapter.arrays(kept))
    return tr.read_step(folder / "step.npz")


def _rows(bound, step) -> dict:
    return {r["cap"]: r for r in tv.judge(step, bound[2])}


def _straight(s, c):
    return s + (ref.tanh_cap(s, c) - s).detach()


def _detached(s, c):
    return ref.tanh_cap(s.detach(), c)


def _bf16_backward(a, c):
    """fp32 forward; the gradient through the same cap computed by autograd in bf16."""
    low = ref.tanh_cap(a.bfloat16(), c)
    return ref.tanh_cap(a, c).detach() + (low - low.detach()).float()


def _with_attention(bound, fn) -> tr.Step:
    model = copy.deepcopy(bound[0])
    with ref.attention_patch(model, cap_fn=fn):
        return _trained(bound, model)


def _with_final(bound, fn) -> tr.Step:
    model = copy.deepcopy(bound[0])
    c = model.config.final_logit_softcapping
    model.config.final_logit_softcapping = None
    model.get_output_embeddings().register_forward_hook(lambda module, args, out: fn(out, c))
    return _trained(bound, model)


def test_the_unchanged_model_applies_both_caps_forward_and_backward(bound):
    rows = _rows(bound, _trained(bound, copy.deepcopy(bound[0])))
    assert {cap: r["verdict"] for cap, r in rows.items()} == {"attention": tv.APPLIED, "final": tv.APPLIED}
    assert rows["final"]["local_grad_error"] <= rows["final"]["local_grad_tolerance"]
    assert "feedforward_layernorm" not in rows["attention"]["grad_where"]  # the exchange explains the norms' gradients


@pytest.mark.parametrize("cap", ["attention", "final"])
def test_a_straight_through_cap_is_named(bound, cap):
    step = _with_attention(bound, _straight) if cap == "attention" else _with_final(bound, _straight)
    rows = _rows(bound, step)
    assert rows[cap]["verdict"] == tv.OTHER and rows[cap]["form"] == tr.FORM_NAMES[0]
    other = "final" if cap == "attention" else "attention"
    assert rows[other]["verdict"] == tv.APPLIED  # the other cap is judged apart


def test_a_detached_attention_cap_is_named(bound):
    rows = _rows(bound, _with_attention(bound, _detached))
    assert rows["attention"]["verdict"] == tv.OTHER and rows["attention"]["form"] == tr.FORM_NAMES[1]
    assert rows["final"]["verdict"] == tv.APPLIED


@pytest.mark.parametrize("cap", ["attention", "final"])
def test_a_bf16_backward_under_an_fp32_forward_is_named(bound, cap):
    step = _with_attention(bound, _bf16_backward) if cap == "attention" else _with_final(bound, _bf16_backward)
    rows = _rows(bound, step)
    assert rows[cap]["verdict"] == tv.OTHER and rows[cap]["form"].startswith(tv.LOWER), rows[cap]
    assert rows["final" if cap == "attention" else "attention"]["verdict"] == tv.APPLIED


@pytest.mark.parametrize("cap", ["attention", "final"])
def test_a_bf16_routes_own_rounding_of_a_caps_backward_is_no_other_gradient(bound, cap):
    """Judged as a bf16 route, the cap's exact backward rounded to bf16 is the route's own format: applied."""
    step = _with_attention(bound, _bf16_backward) if cap == "attention" else _with_final(bound, _bf16_backward)
    rows = {r["cap"]: r for r in tv.judge(step, bound[2], tv.BF16)}
    assert rows[cap]["verdict"] == tv.APPLIED, rows[cap]


def test_a_final_cap_in_the_loss_but_not_in_the_returned_logits_is_named(bound):
    model = copy.deepcopy(bound[0])
    c = model.config.final_logit_softcapping
    forward = type(model).forward

    def planted(self, input_ids=None, labels=None, **kwargs):
        self.config.final_logit_softcapping = None
        try:
            out = forward(self, input_ids=input_ids, **kwargs)
        finally:
            self.config.final_logit_softcapping = c
        out.loss = self.loss_function(ref.tanh_cap(out.logits, c), labels, self.config.vocab_size)
        return out

    model.forward = types.MethodType(planted, model)
    rows = _rows(bound, _trained(bound, model))
    assert rows["final"]["verdict"] == tv.ELSEWHERE and rows["final"]["loss_cell"] == "capped"
    assert rows["final"]["forward_cell"] == "final off"
    assert rows["attention"]["verdict"] == tv.APPLIED


def test_swapped_caps_are_named(bound):
    model = copy.deepcopy(bound[0])
    layers = [m for m in model.modules() if getattr(m, "attn_logit_softcapping", None) is not None]
    c_attention, c_final = layers[0].attn_logit_softcapping, model.config.final_logit_softcapping
    for m in layers:
        m.attn_logit_softcapping = c_final
    model.config.final_logit_softcapping = c_attention
    rows = _rows(bound, _trained(bound, model))
    assert all(r["verdict"] == tv.DIFFERENT and r["form"] == tr.SWAPPED for r in rows.values())


def test_a_dropped_attention_cap_is_ignored_and_the_final_one_still_judged(bound):
    model = copy.deepcopy(bound[0])
    for m in model.modules():
        if getattr(m, "attn_logit_softcapping", None) is not None:
            m.attn_logit_softcapping = None
    rows = _rows(bound, _trained(bound, model))
    assert rows["attention"]["verdict"] == tv.IGNORED and rows["attention"]["forward_cell"] == "attention off"
    assert rows["final"]["verdict"] == tv.APPLIED


def test_a_step_judged_without_the_attention_cap_is_never_placed_in_a_model_with_it(bound):
    """The unchanged model's step, judged with the references that apply the attention cap left out (as the watch
    leaves them out where it saw no call): its forward is placed in none of them."""
    step = _trained(bound, copy.deepcopy(bound[0]))
    rows = {r["cap"]: r for r in tv.judge(step, bound[2], without=frozenset({"attention"}))}
    assert rows["attention"]["forward_cell"] is None or "attention" not in tv.ON[rows["attention"]["forward_cell"]]
    assert rows["attention"]["verdict"] != tv.APPLIED
    swapped = tr.Step(step.loss, bound[2].swapped.logits, step.grads)  # a model with both caps, their values swapped
    assert {r["forward_cell"] for r in tv.judge(swapped, bound[2], without=frozenset({"attention"}))} != {tr.SWAPPED}


def test_a_non_finite_step_is_not_finite(bound):
    step = _trained(bound, copy.deepcopy(bound[0]))
    name = next(iter(step.grads))
    broken = tr.Step(step.loss, step.logits, {**step.grads, name: step.grads[name] * np.nan})
    assert {r["verdict"] for r in tv.judge(broken, bound[2])} == {tv.NOT_FINITE}


def test_every_folder_of_a_run_carries_the_capped_folders_tokenizer(bound, tmp_path):
    """A route that builds its tokenizer from the folder must find the same one in the sweep and rows folders as in
    the capped one: without it transformers builds its default for the model type, which pads on the other side
    (axolotl's sweeps read padding positions until the folders carried it)."""
    from softcapgrad.engines.training import parity as train_parity

    _capped_folder(bound, tmp_path)
    folders = [*train_parity.sweep_folders(bound[0], bound[1], tmp_path)]
    assert train_parity.row_folder(bound[0], bound[1], tmp_path) is not None
    folders.append(train_parity.ROWS_FOLDER)
    files = sorted(p.name for p in (tmp_path / "capped").iterdir() if p.name.startswith("tokenizer"))
    assert files
    for name in folders:
        for file in files:
            assert (tmp_path / name / file).read_bytes() == (tmp_path / "capped" / file).read_bytes(), (name, file)


def test_the_attention_cap_bracket_leaves_out_masked_scores_and_non_positive_inputs():
    """A masked score gets no dL/dz, so its dL/da is 0 whatever the cap does: it must not count as a zero."""
    from softcapgrad.engines.training import parity as train_parity

    calls = np.array([[10.0, 1e-3, 1.0, 50.0], [400.0, 1e-9, 1.0, 50.0], [460.0, 0.0, 1.0, 50.0],
                      [300.0, 0.0, 0.0, 50.0], [-470.0, 0.0, 1.0, 50.0], [500.0, 0.0, 1.0, 50.0]])
    step = tr.Step(0.0, np.zeros((2, 2)), {}, attention=calls)
    zero = train_parity.first_zero_attention([step, tr.Step(0.0, np.zeros((2, 2)), {})], 50.0)
    assert zero["first_dead"] == 460.0 and zero["last_alive"] == 400.0 and zero["zeros"] == 2, zero
    assert zero["largest"] == 500.0 and zero["first_dead_over_c"] == 460.0 / 50.0
    assert train_parity.first_zero_attention([tr.Step(0.0, np.zeros((2, 2)), {})], 50.0) == train_parity.NO_ZERO


def test_an_attention_row_says_whether_the_route_ran_no_cap_or_exposes_nothing(monkeypatch):
    from softcapgrad.engines.training import parity as train_parity, zeros as train_zeros

    monkeypatch.setattr(train_zeros, "stacks_within", lambda zero, c: [])  # every CPU stack compiled: not asked here

    watched = tr.Step(0.0, np.zeros((2, 2)), {}, attention=np.zeros((0, 4)))
    row = {"cap": "attention"}
    train_parity._attention_zero(row, [watched], 50.0, "fp32")
    assert "ran no attention-cap call" in row["first_dead_note"] and "first_dead" not in row, row
    row = {"cap": "attention"}
    train_parity._attention_zero(row, [tr.Step(0.0, np.zeros((2, 2)), {})], 50.0, "fp32")
    assert "does not expose the attention scores" in row["first_dead_note"], row
    calls = np.array([[440.0, 1e-9, 1.0, 50.0], [470.0, 0.0, 1.0, 50.0]])
    live = tr.Step(0.0, np.zeros((2, 2)), {}, attention=calls)
    row = {"cap": "attention"}
    train_parity._attention_zero(row, [live], 50.0, "fp32")
    assert row["first_dead"] == 470.0 and row["agrees"] is True and row["stack"] == "torch-eager-cpu (float32)"
    # a route that caps the scores with another value (torchtune's builder swaps the caps): judged at its own c
    calls = np.array([[260.0, 1e-9, 1.0, 30.0], [280.0, 0.0, 1.0, 30.0]])
    swapped = tr.Step(0.0, np.zeros((2, 2)), {}, attention=calls)
    row = {"cap": "attention"}
    train_parity._attention_zero(row, [swapped], 50.0, "fp32")
    assert row["c_used"] == 30.0 and "divide by c = 30, not the model's 50" in row["first_dead_note"], row
    assert row["agrees"] is True and row["stack_first_zero"] < 271.0, row


def test_a_step_file_with_a_malformed_attention_array_is_unreadable(tmp_path):
    path = tmp_path / "step.npz"
    np.savez(path, loss=np.float64(1.0), logits=np.zeros((2, 3)), attention_cap=np.zeros((4, 3)))
    assert "attention_cap holds (4, 3)" in tr.readable(path)


def test_a_route_without_a_first_zero_says_why():
    from softcapgrad.engines.training import parity as train_parity

    none = dict(train_parity.NO_ZERO)
    row = {"verdict": tv.DIFFERENT}
    failed = {"variants_failed": {"sweep-12": "ValueError: no"}}
    assert train_parity._no_zero(none, failed, row, False, True) == "sweep-12 did not run (ValueError: no)"
    seen = {**none, "largest": 120.5}
    assert "up to 120.5" in train_parity._no_zero(seen, {}, row, False, True)
    assert "its verdict is different" in train_parity._no_zero(none, {}, row, False, False)
    undecided = {"verdict": tv.NOT_BOUND, "forward_cell": "attention off"}
    assert "nearest attention off, not the capped" in train_parity._no_zero(none, {}, undecided, False, False)
    assert "cannot tell" in train_parity._no_zero(none, {}, {"verdict": tv.NOT_BOUND}, False, False)
    assert "another route of its engine" in train_parity._no_zero(none, {}, row, True, False)
    assert "no gradient of the head weight" in train_parity._no_zero(none, {}, row, False, True)
    assert f"fewer than {train_parity.ROWS} head rows" in train_parity._no_zero(none, {}, row, False, None)


def test_the_first_zero_is_the_smallest_dead_input_with_the_last_alive_below_it():
    from softcapgrad.engines.training import parity as train_parity

    a = np.array([[10.0, 270.0, 271.0, 400.0, -500.0], [269.0, 275.0, 0.5, 280.0, 3.0]])
    da = np.array([[1e-3, 1e-9, 0.0, 0.0, 0.0], [1e-8, 2e-9, 0.3, 0.0, 0.0]])
    g = np.ones_like(a)
    g[1, 4] = 0.0  # no upstream gradient: its zero says nothing of the cap
    step = tr.Step(0.0, a, {}, a, da, g)
    zero = train_parity.first_zero([step], 30.0, np.zeros(2, dtype=np.int64))
    assert zero["first_dead"] == 271.0 and zero["last_alive"] == 270.0 and zero["zeros"] == 3
    assert train_parity.stack_agreement(zero, "fp32", 30.0)["agrees"]  # stacks' fp32 first zero, c = 30: in between
    late = tr.Step(0.0, a, {}, a, np.where(a > 271.0, 0.0, 1.0), g)
    assert train_parity.stack_agreement(train_parity.first_zero([late], 30.0, None), "fp32", 30.0)["agrees"] is False


@pytest.mark.parametrize("args", [["--model-type", "nope"], ["--engine", "nope"], ["--seq-len", "1"],
                                  ["--model-type", "t5gemma"], ["--timeout", "0"]])
def test_bad_options_are_one_line_and_exit_2(cli, args):
    code, _, out, err = cli("train-parity", *args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err


def test_trainer_at_its_defaults_through_the_runner_keeps_both_caps(bound, tmp_path):
    """The real adapter in a child (main environment, Trainer, fp32): both caps applied, and each cap's first zero
    where stacks' torch-eager-cpu has fp32's, the final cap's at c = 30 and the attention cap's at c = 50 (read
    from every attention-cap call of the step on the folder whose queries push it to |a/c| = 24)."""
    from softcapgrad.engines.environments import environments
    from softcapgrad.engines.forward import runner
    from softcapgrad.engines.training import parity as train_parity

    model, ids, reference = bound[0], bound[1], bound[2]
    runner.write_ids(tmp_path, ids)
    tr.save_folder(model, tmp_path / "capped")
    folders = ["capped", *train_parity.sweep_folders(model, ids, tmp_path),
               *train_parity.attention_folder(model, ids, tmp_path)]
    assert folders[-1] == train_parity.ATTENTION_FOLDER
    rows, steps, info = train_parity._route("transformers", train_parity.ROUTES[0], environments.state("main"),
                                            reference, tmp_path, folders, 120.0)
    assert info["reason"] is None and info["precision"] == "fp32", info
    assert [r["verdict"] for r in rows] == [tv.APPLIED, tv.APPLIED], rows
    zero = train_parity.first_zero(list(steps.values()), reference.caps["final"], ids)
    assert train_parity.stack_agreement(zero, "fp32", reference.caps["final"])["agrees"] is True, zero
    scores = train_parity.first_zero_attention(list(steps.values()), reference.caps["attention"])
    assert scores["zeros"] > 0 and scores["largest"] > 20 * reference.caps["attention"], scores
    assert train_parity.stack_agreement(scores, "fp32", reference.caps["attention"])["agrees"] is True, scores


def test_the_run_lists_the_adapters_routes_and_the_adapter_imports_no_softcapgrad():
    import ast

    from softcapgrad.engines.training import parity as train_parity

    path = catalog.script(train_parity.ADAPTER)
    assert set(catalog._literal_routes(path)) == {r.id for r in train_parity.ROUTES}
    for engine, adapter in train_parity.ADAPTERS.items():  # less the monitor's route, which is not a matrix row
        routes = set(catalog._literal_routes(catalog.script(adapter))) - {"monitor"}
        assert routes == {r.id for r in train_parity.routes(engine)}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "softcapgrad" not in imported
    assert {r.id for r in train_parity.ROUTES if r.precision == "bf16"} == {"default-bf16", "eager-bf16"}


# --- LoRA (peft) and a fused head (trl's SFTTrainer) -------------------------------------------------------------

ADAPTED = ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight")


def _as_lora(step: tr.Step, rank: int = 4, scale: float = 2.0) -> dict:
    """What a LoRA step on the same model returns at B = 0: dL/dB = scale·(dL/dW)·Aᵀ for two adapted weights, written
    and read back through a route's file."""
    rng = np.random.default_rng(0)
    a = {n: rng.standard_normal((rank, step.grads[n].shape[1])) / step.grads[n].shape[1] ** 0.5 for n in ADAPTED}
    arrays = {"loss": np.asarray(step.loss), "logits": step.logits, "precap": step.precap,
              "precap_grad": step.precap_grad, "lora_scale": np.asarray(scale)}
    arrays |= {f"grad/{n}": scale * step.grads[n] @ a[n].T for n in ADAPTED} | {f"lora_A/{n}": a[n] for n in ADAPTED}
    return arrays


def _read(tmp_path, arrays) -> tr.Step:
    np.savez(tmp_path / "lora.npz", **arrays)
    return tr.read_step(tmp_path / "lora.npz")


def test_a_lora_step_is_judged_through_its_adapters(bound, tmp_path):
    """The references' dL/dW, seen through each adapter's A, decide a LoRA step as they decide a full one."""
    rows = _rows(bound, _read(tmp_path, _as_lora(_trained(bound, copy.deepcopy(bound[0])))))
    assert {cap: r["verdict"] for cap, r in rows.items()} == {"attention": tv.APPLIED, "final": tv.APPLIED}, rows
    assert "LoRA" in rows["attention"]["hint"]
    planted = _rows(bound, _read(tmp_path, _as_lora(_with_attention(bound, _straight))))
    assert planted["attention"]["verdict"] == tv.OTHER and planted["attention"]["form"] == tr.FORM_NAMES[0]


def test_a_lora_file_without_its_a_or_scale_is_unreadable(bound, tmp_path):
    arrays = _as_lora(_trained(bound, copy.deepcopy(bound[0])))
    del arrays["lora_scale"]
    np.savez(tmp_path / "bad.npz", **arrays)
    assert "LoRA" in tr.readable(tmp_path / "bad.npz")


def _fused(step: tr.Step, ids) -> tr.Step:
    """The same step as a fused head returns it: each position's log-prob of the next token, no logits, no a."""
    return tr.Step(step.loss, None, step.grads, token_log_probs=tr.next_token_log_probs(step.logits, ids))


def test_a_fused_head_is_judged_on_its_token_log_probs(bound):
    ids = bound[1]
    rows = _rows(bound, _fused(_trained(bound, copy.deepcopy(bound[0])), ids))
    assert {cap: r["verdict"] for cap, r in rows.items()} == {"attention": tv.APPLIED, "final": tv.APPLIED}, rows
    model = copy.deepcopy(bound[0])
    model.config.final_logit_softcapping = None  # a fused loss that never applies the final cap
    dropped = _rows(bound, _fused(_trained(bound, model), ids))
    assert dropped["final"]["verdict"] == tv.IGNORED and dropped["final"]["forward_cell"] == "final off"


def test_a_cap_that_is_not_set_leaves_one_reference_of_each_pair(bound):
    """Where transformers never applies the attention cap, 'attention off' is 'capped' and 'uncapped' 'final off':
    one of each twin is judged against, so a step is not equally near two cells."""
    reference = copy.copy(bound[2])
    object.__setattr__(reference, "applied", {"attention": False, "final": True})
    assert list(tv.distinct(reference)) == ["capped", "final off"]
    assert list(tv.distinct(bound[2])) == ["capped", "attention off", "final off", "uncapped"]


def _capped_folder(bound, tmp_path):
    """The bound model's folder (with its tokenizer) and ids under ``tmp_path``, as a route reads them; its
    reference."""
    from softcapgrad.engines.forward import runner

    model, ids = bound[0], bound[1]
    runner.write_ids(tmp_path, ids)
    tr.save_folder(model, tmp_path / "capped")
    return bound[2]


@pytest.mark.slow
@pytest.mark.engine_environments("train-peft")
def test_peft_lora_and_trl_sft_through_the_runner(bound, tmp_path, engine_environment):
    """peft LoRA and trl's SFTTrainer live from their environment on Gemma 2: LoRA keeps both caps forward and
    backward; SFTTrainer at SFTConfig's defaults trains in bf16 through trl's fused head, and with bf16=False that
    head keeps both caps forward and backward."""
    from softcapgrad.engines.training import parity as train_parity

    state = engine_environment("train-peft")
    reference = _capped_folder(bound, tmp_path)
    routes = {r.id: r for r in train_parity.LIBRARY_ROUTES}
    seen = {}
    for name in ("lora", "sft", "sft-fp32"):
        rows, steps, info = train_parity._route("peft-trl", routes[name], state, reference, tmp_path, ["capped"], 180.0)
        assert info["reason"] is None, info
        seen[name] = ([r["verdict"] for r in rows], info["precision"], steps["capped"])
    assert seen["lora"][:2] == ([tv.APPLIED, tv.APPLIED], "fp32") and seen["lora"][2].lora
    assert seen["sft"][1] == "bf16" and seen["sft"][2].logits is None  # SFTConfig's default; the fused head
    assert seen["sft-fp32"][:2] == ([tv.APPLIED, tv.APPLIED], "fp32")


@pytest.mark.slow
@pytest.mark.engine_environments("train-axolotl")
def test_axolotl_trains_gemma2_on_sdpa_and_its_cpu_default_cannot_start(bound, tmp_path, engine_environment):
    """axolotl live from its environment on Gemma 2, one step from a YAML config through its own loader and trainer
    builder: in fp32 the attention is left to transformers 5.16.1, which picks sdpa, so the attention cap is
    ignored and the final cap kept, its gradient first 0 where stacks' torch-eager-cpu has it (read on the sweep
    folder, whose batch axolotl pads as the folder's tokenizer says); axolotl's own default on a CPU (bf16: auto
    becomes fp16) stops before the step with float32 hidden states meeting float16 weights."""
    from softcapgrad.engines.training import parity as train_parity

    state = engine_environment("train-axolotl")
    reference = _capped_folder(bound, tmp_path)
    routes = {r.id: r for r in train_parity.AXOLOTL_ROUTES}
    folders = ["capped", train_parity.sweep_folders(bound[0], bound[1], tmp_path)[0]]
    rows, steps, info = train_parity._route("axolotl", routes["fp32"], state, reference, tmp_path, folders, 180.0)
    assert info["reason"] is None and info["precision"] == "fp32", info
    assert "attention sdpa" in info["did"] and "weights float32" in info["did"], info["did"]
    assert {r["cap"]: r["verdict"] for r in rows} == {"attention": tv.IGNORED, "final": tv.APPLIED}, rows
    zero = train_parity.first_zero(list(steps.values()), reference.caps["final"], reference.ids)
    assert train_parity.stack_agreement(zero, "fp32", reference.caps["final"])["agrees"] is True, zero
    rows, _, info = train_parity._route("axolotl", routes["default"], state, reference, tmp_path, ["capped"], 180.0)
    assert [r["verdict"] for r in rows] == [tv.NOT_RUN, tv.NOT_RUN] and info["precision"] == "fp16", info
    assert "float != c10::Half" in info["reason"], info["reason"]


@pytest.mark.slow
@pytest.mark.engine_environments("train-easydel")
def test_easydel_trains_gemma2_without_its_attention_cap_on_another_window_and_rotary(bound, tmp_path,
                                                                                     engine_environment):
    """EasyDeL live from its environment on Gemma 2, one step of its Trainer's own step function: asked for float32,
    its step is placed in the reference planted with its two deviations outside the caps (the rotary table in bf16,
    the local window one key wider) and without the attention cap, which it never passes to its attention; its final
    cap, judged on the step's own dL/da (a zero probe added before the cap), is applied; at its defaults it reads
    the folder through float16 and computes the attention in bf16: another model, its final cap still its own."""
    from softcapgrad.engines.forward import alternatives
    from softcapgrad.engines.training import parity as train_parity

    state = engine_environment("train-easydel")
    reference = _capped_folder(bound, tmp_path)
    routes = {r.id: r for r in train_parity.EASYDEL_ROUTES}
    rows, _, info = train_parity._route("easydel", routes["fp32"], state, reference, tmp_path, ["capped"], 300.0)
    assert info["reason"] is None and "attn_dtype float32" in info["did"], info
    form = f"{alternatives.WIDER}, {alternatives.ROTARY_BF16}{tr.OFF}"
    by_cap = {r["cap"]: r for r in rows}
    assert by_cap["attention"]["verdict"] == tv.IGNORED and by_cap["attention"]["forward_cell"] == form, by_cap
    assert by_cap["final"]["verdict"] == tv.APPLIED and "sech²" in by_cap["final"]["hint"], by_cap  # its own dL/da
    rows, _, info = train_parity._route("easydel", routes["default"], state, reference, tmp_path, ["capped"], 300.0)
    assert "attn_dtype bfloat16" in info["did"], info["did"]
    assert {r["cap"]: r["verdict"] for r in rows} == {"attention": tv.DIFFERENT, "final": tv.APPLIED}, rows


@pytest.mark.slow
@pytest.mark.engine_environments("train-easydel")
def test_easydel_bf16_cap_gradient_dies_where_xla_s_does(bound, tmp_path, engine_environment):
    """EasyDeL's bf16 step, its final cap's input pushed past the horizon: the first zero of the step's own dL/da,
    bracketed by the a of a forward jitted as the step is, holds jax-jit-cpu's bf16 first zero (c = 30: 104). An
    eager forward's a is not the step's in bf16 (it rounds every op where XLA's fused one does not): bracketed by
    it, the first zero had read 64, earlier than any stack."""
    from softcapgrad.engines.forward import runner
    from softcapgrad.engines.training import parity as train_parity
    from softcapgrad.stacks import registry

    state = engine_environment("train-easydel")
    model, ids, reference = bound[0], bound[1], bound[2]
    runner.write_ids(tmp_path, ids)
    tr.save_folder(model, tmp_path / "capped")
    folders = ["capped", *train_parity.sweep_folders(model, ids, tmp_path)]
    route = next(r for r in train_parity.EASYDEL_ROUTES if r.id == "bf16")
    rows, steps, info = train_parity._route("easydel", route, state, reference, tmp_path, folders, 300.0)
    assert info["reason"] is None and info["precision"] == "bf16", info
    c = reference.caps["final"]
    zero = train_parity.first_zero(list(steps.values()), c, ids)
    xla = registry.first_zero("jax-jit-cpu", "bfloat16", c).value
    assert zero["first_dead"] is not None and zero["last_alive"] < xla <= zero["first_dead"], (zero, xla)


@pytest.mark.slow
@pytest.mark.engine_environments("train-penzai")
def test_penzai_names_the_loader_gemma_would_need_and_why_it_cannot_take_the_folder(bound, tmp_path,
                                                                                    engine_environment):
    """penzai live from its environment: asked for a reader of Gemma 2 weights, it has none of a Hugging Face folder
    (its Hugging Face readers are of other families), and its Gemma loader builds only its presets' layer counts;
    the row is that reason, measured from the installed penzai."""
    from softcapgrad.engines.training import parity as train_parity

    state = engine_environment("train-penzai")
    reference = _capped_folder(bound, tmp_path)
    rows, _, info = train_parity._route("penzai", train_parity.PENZAI_ROUTES[0], state, reference, tmp_path,
                                        ["capped"], 120.0)
    assert [r["verdict"] for r in rows] == [tv.NOT_RUN, tv.NOT_RUN], rows
    assert "gemma_from_pretrained_checkpoint" in info["reason"] and "this folder has 2)" in info["reason"]
    assert "are of gpt_neox, llama, llamalike_common, mistral" in info["reason"] and "(18, 26, 28, 42, 46;" in info["reason"]


def test_a_rows_versions_name_the_library_that_trained_first():
    from softcapgrad.engines.training import parity as train_parity

    versions = {"torch": "2.13.0+cpu", "axolotl": "0.19.0", "transformers": "5.16.1", "posthog": "6.7.11",
                "trl": "1.9.0"}
    said = "axolotl 0.19.0, trl 1.9.0, transformers 5.16.1, torch 2.13.0+cpu"
    assert train_parity._short(versions, "axolotl") == said
    assert train_parity._short(versions, "transformers") == "transformers 5.16.1, torch 2.13.0+cpu"


def test_the_answer_quotes_a_short_reason_whole_and_a_long_one_to_its_first_clause():
    from softcapgrad.engines.training import results as train_results

    short = "RuntimeError: expected m1 and m2 to have the same dtype, but got: float != c10::Half"
    long = "ValueError: Received 13 parameters not in model: " + ", ".join(f"model.w{i}" for i in range(40))
    row = {"verdict": tv.NOT_RUN, "engine": "e", "route": "r", "model": "gemma2", "cap": "final"}
    third = train_results.answer({"rows": [{**row, "hint": short}, {**row, "route": "s", "hint": long}]})[-1]
    assert short in third and "ValueError: Received 13 parameters not in model." in third, third
    assert "model.w0" not in third, third


def test_a_final_cap_on_the_hidden_state_is_applied_to_another_tensor(bound):
    """torchtune's Gemma2FinalNorm caps the normed hidden state, not the logits: planted here, the final row says
    so and the attention row is still judged against that model."""
    model = copy.deepcopy(bound[0])
    c = model.config.final_logit_softcapping
    model.config.final_logit_softcapping = None
    model.get_output_embeddings().register_forward_pre_hook(lambda m, args: (ref.tanh_cap(args[0], c),))
    rows = _rows(bound, _trained(bound, model))
    assert rows["final"]["verdict"] == tv.ELSEWHERE and rows["final"]["form"] == tr.HIDDEN, rows["final"]
    assert rows["attention"]["verdict"] == tv.APPLIED, rows["attention"]


@pytest.mark.slow
@pytest.mark.engine_environments("torchtune")
def test_torchtune_trains_its_own_gemma2_with_the_caps_elsewhere(bound, tmp_path, engine_environment):
    """torchtune's full fine-tune step, live from parity's torchtune environment: as its named builders pass the
    caps, both are swapped and the final one caps the hidden state; with the config's caps the final cap still caps
    the hidden state. Its gradients, converted back by torchtune's own gemma2_tune_to_hf, come back with the pre- and
    post-feed-forward norms exchanged (its _convert_weights maps one onto the other), which these models, whose
    norms hold gains drawn apart, see forward too: each route matches the reference with the same exchange."""
    from softcapgrad.engines.forward import runner
    from softcapgrad.engines.training import parity as train_parity

    state = engine_environment("torchtune")
    model, ids, reference = bound[0], bound[1], bound[2]
    runner.write_ids(tmp_path, ids)
    tr.save_folder(model, tmp_path / "capped")
    routes = {r.id: r for r in train_parity.TUNE_ROUTES}
    named, _, info = train_parity._route("torchtune", routes["default"], state, reference, tmp_path, ["capped"], 180)
    assert info["reason"] is None, info
    assert {r["verdict"] for r in named} == {tv.DIFFERENT} and {r["form"] for r in named} == {tr.EXCHANGED}
    config, steps, _ = train_parity._route("torchtune", routes["config-caps"], state, reference, tmp_path, ["capped"],
                                           180)
    rows = {r["cap"]: r for r in config}
    assert rows["final"]["verdict"] == tv.ELSEWHERE and rows["final"]["form"] == tr.HIDDEN_EXCHANGED
    # its gradients, named back through torchtune's converter, lie within a few fp32 tolerances of that model's but
    # not within one: with a lone reference that is 'not bound', not applied
    assert rows["attention"]["verdict"] == tv.NOT_BOUND
    assert rows["attention"]["grad_error"] < verdict_ratio() * rows["attention"]["grad_tolerance"]
    assert "feedforward_layernorm" not in rows["attention"]["grad_where"]  # the exchange explains the norms' gradients


@pytest.mark.slow
@pytest.mark.engine_environments("litgpt")
def test_litgpt_trains_gemma2_with_both_caps_and_its_head_untied(bound, tmp_path, engine_environment):
    """LitGPT's finetune_full step, live from parity's LitGPT environment: its named gemma-2-2b config carries both
    caps, applied forward and backward (the final one on its own a, which the route exposes); its converter gives the output head a copy of the tied embedding, which the
    route says (the two gradients are summed as the tied model's)."""
    from softcapgrad.engines.forward import runner
    from softcapgrad.engines.training import parity as train_parity

    state = engine_environment("litgpt")
    model, ids, reference = bound[0], bound[1], bound[2]
    runner.write_ids(tmp_path, ids)
    tr.save_folder(model, tmp_path / "capped")
    rows, _, info = train_parity._route("litgpt", train_parity.LIT_ROUTES[0], state, reference, tmp_path, ["capped"],
                                        180)
    assert info["reason"] is None and "lm_head is a parameter of its own" in info["did"], info
    assert [r["verdict"] for r in rows] == [tv.APPLIED, tv.APPLIED], rows
    assert "sech²(a/c) of the route's own a" in rows[1]["hint"]  # its a exposed: the cap's own arithmetic judged


@pytest.mark.slow
@pytest.mark.engine_environments("torchtune", "litgpt")
@pytest.mark.parametrize("engine, adapter", [("torchtune", "torch_tune"), ("litgpt", "lit_gpt")])
def test_the_monitor_counts_inside_torchtune_and_litgpt_steps_as_a_brute_force_does(bound, tmp_path,
                                                                                  engine_environment, engine, adapter):
    """softcapgrad's DeadZoneMonitor around two steps of torchtune's full fine-tune recipe and of LitGPT's
    finetune_full (an SGD update between them: the first step watched op by op, the second through the sites it
    learnt), on the capped model with its final site pushed to |a/c| = 24, past fp32's horizon: per module, the
    tanh calls, elements, outputs stored as ±1 and exact-zero gradients it counts are the brute force's (every
    tanh the library called, recorded by a function mode of its own), and there are some of each."""
    from softcapgrad.engines.forward import runner
    from softcapgrad.engines.training import parity as train_parity

    state = engine_environment(engine)
    model, ids = bound[0], bound[1]
    _capped_folder(bound, tmp_path)
    pushed = train_parity.sweep_folders(model, ids, tmp_path)[-1]
    outcome = runner.run(state.python, f"train_{adapter}", "monitor", tmp_path, [pushed], 300)
    assert outcome.reason is None, outcome.stderr
    with np.load(tmp_path / "out" / "monitor" / f"{pushed}.npz", allow_pickle=False) as step:
        modules, watched, brute = list(step["monitor/modules"]), step["monitor/watched"], step["monitor/brute"]
    assert len(modules) >= 3, modules  # each layer's attention and the final cap's site
    assert np.array_equal(watched, brute), dict(zip(modules, zip(watched.tolist(), brute.tolist())))
    assert brute[:, 2].sum() > 0 and brute[:, 3].sum() > 0  # outputs stored as ±1, gradients exactly 0


@pytest.mark.slow
@pytest.mark.engine_environments("train-kerashub")
def test_keras_hub_fit_keeps_both_caps_on_jax_and_torch(bound, tmp_path, engine_environment):
    """Keras Hub's own Gemma 2, one fit step on each backend, live from its environment: both caps applied forward
    and backward in float32; its gradients, read through SGD and mapped back by Keras Hub's own converter, lie
    within the fp32 bound of transformers'."""
    from softcapgrad.engines.forward import runner
    from softcapgrad.engines.training import parity as train_parity

    state = engine_environment("train-kerashub")
    model, ids, reference = bound[0], bound[1], bound[2]
    runner.write_ids(tmp_path, ids)
    tr.save_folder(model, tmp_path / "capped")
    for route in (r for r in train_parity.KERAS_ROUTES if r.precision == "fp32"):
        rows, _, info = train_parity._route("kerashub", route, state, reference, tmp_path, ["capped"], 300)
        assert info["reason"] is None and f"{route.id} backend" in info["did"], info
        assert [r["verdict"] for r in rows] == [tv.APPLIED, tv.APPLIED], rows
        assert all(r["grad_error"] <= r["grad_tolerance"] for r in rows)


def test_keras_gradients_go_back_through_the_converters_rearrangement():
    """Keras Hub's converter reshapes and transposes a query projection (heads × head size, hidden) into a kernel
    (heads, hidden, head size): a gradient in the kernel's layout lands on the transformers entry it came from."""
    sys.path += [str(p) for p in catalog.ADAPTER_PATH if str(p) not in sys.path]
    spec = importlib.util.spec_from_file_location("adapter_train_kerashub", catalog.script("train_kerashub"))
    keras_adapter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(keras_adapter)

    def hook(hf, keras_shape):  # convert_gemma.py's query kernel
        return np.transpose(np.reshape(hf, (keras_shape[0], keras_shape[2], keras_shape[1])), axes=(0, 2, 1))

    hf = np.random.default_rng(0).standard_normal((2 * 3, 4))  # 2 heads of size 3, hidden 4
    kernel = hook(hf, [2, 4, 3])
    assert np.array_equal(keras_adapter.to_hf(kernel, hook, hf.shape, [2, 4, 3]), hf)
    with pytest.raises(RuntimeError, match="not a rearrangement"):
        keras_adapter.to_hf(kernel, lambda x, _: hook(x, [2, 4, 3]) + 1, hf.shape, [2, 4, 3])


@pytest.mark.slow
@pytest.mark.engine_environments("torchtune")
def test_torchtune_exchanges_the_feed_forward_norms_forward_too(bound, tmp_path, engine_environment):
    """The same exchange seen forward, where parity's tiny models hide it: with distinct weights in the two
    feed-forward norms, torchtune's log-probs (parity's adapter, config caps) lie within the fp32 whole-model bound of
    transformers' model with those norms exchanged (and the final cap on the hidden state), and far from the model
    as the folder holds it."""
    import torch

    from softcapgrad.engines.forward import runner, verdict

    state = engine_environment("torchtune")
    model, ids = copy.deepcopy(bound[0]), bound[1]
    g = torch.Generator().manual_seed(1)
    layers = model.model.layers
    with torch.no_grad():
        for layer in layers:
            for norm in (layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm):
                norm.weight.copy_(torch.randn(norm.weight.shape, generator=g) * 0.5)
    runner.write_ids(tmp_path, ids)
    tr.save_folder(model, tmp_path / "capped")
    outcome = runner.run(state.python, "torch_tune", "config-caps", tmp_path, ["capped"], 180)
    assert outcome.reason is None, outcome.reason
    engine = verdict.log_probs(outcome.logits["capped"])
    as_held = verdict.log_probs(ref.hidden_capped(model, ids))
    with torch.no_grad():
        for layer in layers:
            pre, post = layer.pre_feedforward_layernorm.weight, layer.post_feedforward_layernorm.weight
            swapped = pre.clone()
            pre.copy_(post)
            post.copy_(swapped)
    exchanged = verdict.log_probs(ref.hidden_capped(model, ids))
    width = max(model.config.hidden_size, model.config.intermediate_size)
    bound_fp32 = verdict.tolerance(verdict.FP32, float(np.abs(outcome.logits["capped"]).max()), width)
    assert verdict.error(engine, exchanged).value <= bound_fp32
    assert verdict.error(engine, as_held).value > 1000 * bound_fp32


def test_a_model_that_differs_elsewhere_is_not_said_to_give_its_cap_another_gradient(bound):
    """A route whose whole model lies far from every reference (Keras Hub's Gemma 3 builds another layer pattern)
    but whose returned logits are c·tanh(a/c) of its own a, with dL/da not exposed: 'different', outside the caps,
    never 'another gradient' for a backward nobody saw."""
    reference = bound[2]
    capped = reference.steps["capped"]
    a = capped.precap + np.random.default_rng(0).normal(0.0, 20.0, capped.precap.shape)  # another model's a
    c = reference.caps["final"]
    step = tr.Step(capped.loss + 1.0, c * np.tanh(a / c), capped.grads, precap=a)
    rows = _rows(bound, step)
    assert rows["final"]["verdict"] == tv.DIFFERENT and "outside the caps" in rows["final"]["hint"]
    assert "does not expose" in rows["final"]["hint"]


def test_a_model_without_its_sliding_window_is_named_and_its_caps_still_judged(bound):
    """A route whose local layers attend to every token (mlx-lm's Gemma 2): the attention row says the model is
    'different' and names the form; the final cap, judged on the route's own a, is applied."""
    from softcapgrad.engines.forward.alternatives import WINDOWLESS

    reference = bound[2]
    windowless = reference.others[WINDOWLESS]
    assert tv.logit_error(windowless, reference.steps["capped"]) > 100 * tv.tolerances(reference, tv.verdict.FP32)[
        "forward"]  # the window binds on this model: the form is another model, not a twin of the capped one
    rows = _rows(bound, windowless)
    assert rows["attention"]["verdict"] == tv.DIFFERENT and rows["attention"]["form"] == WINDOWLESS
    assert "its gradients match that model's" in rows["attention"]["hint"]
    assert rows["final"]["verdict"] == tv.APPLIED


def test_a_model_that_differs_outside_the_caps_is_placed_and_its_caps_judged_there(bound):
    """EasyDeL's Gemma 2 keeps its rotary table in bf16 and reads the local window as one key wider, and never applies
    the attention cap: planted in the float64 reference, such a step is placed in that form's cell (each deviation
    moves the log-probs far beyond the tolerance here), its attention cap ignored and its final cap applied; with
    the attention cap kept, both are applied. The forms leave the model as it was."""
    from softcapgrad.engines.forward import alternatives

    reference = bound[2]
    model, ids = reference.model, reference.ids
    tol = tv.tolerances(reference, tv.verdict.FP32)["forward"]
    both = f"{alternatives.WIDER}, {alternatives.ROTARY_BF16}"
    planted = [n for n in tr.OUTSIDE if alternatives.FULL_ROTARY_BF16 not in n]  # Gemma 2's rotary takes no layer type
    assert set(reference.others) & set(tr.OUTSIDE) == set(planted) and both + tr.OFF in reference.others
    for name in (*planted, both + tr.OFF):
        assert tv.logit_error(reference.others[name], reference.steps["capped"]) > 100 * tol, name
    with alternatives.window_widened(model), alternatives.rotary_rounded(model):
        ignored = tr.step(model, ids, ("attention",))
        kept = tr.step(model, ids)
    rows = _rows(bound, ignored)
    assert rows["attention"]["verdict"] == tv.IGNORED and rows["attention"]["forward_cell"] == both + tr.OFF, rows
    assert rows["final"]["verdict"] == tv.APPLIED, rows
    assert {r: v["verdict"] for r, v in _rows(bound, kept).items()} == {"attention": tv.APPLIED, "final": tv.APPLIED}
    again = tr.step(model, ids)
    assert again.loss == reference.steps["capped"].loss and np.array_equal(again.logits,
                                                                            reference.steps["capped"].logits)


def test_a_bf16_rounding_of_part_of_the_model_is_no_other_model_for_a_bf16_route(bound):
    """The rotary-in-bf16 forms are cells for an fp32 route only: a bf16 route rounds at least that much of its own,
    and must not be placed there instead of deciding its caps (a bf16 Trainer step was, before this rule)."""
    from softcapgrad.engines.forward import alternatives
    from softcapgrad.engines.forward.catalog import LOW

    others = {**bound[2].others, **{n + off: None for n in tr.OUTSIDE for off in ("", tr.OFF)}}  # Gemma 3's too
    rounded = {n for n in others if "rotary" in n}
    assert len(rounded) == 8 and set(tv.placeable(others, tv.verdict.FP32)) == set(others)
    assert set(tv.placeable(others, LOW["bf16"])) == set(others) - rounded
    assert alternatives.WIDER + tr.OFF in tv.placeable(others, LOW["bf16"])  # a window is no rounding


def test_a_frozen_parameter_is_left_out_only_where_the_route_names_it(bound, tmp_path):
    """mlx-lm's full fine-tune trains no embedding: a step without that gradient is applied when its file names the
    parameter frozen, and not when it does not (a gradient that never arrived is a finding)."""
    capped = bound[2].steps["capped"]
    name = "model.embed_tokens.weight"
    arrays = {"loss": np.asarray(capped.loss), "logits": capped.logits, "precap": capped.precap,
              "precap_grad": capped.precap_grad, "logits_grad": capped.logits_grad,
              **{f"grad/{k}": v for k, v in capped.grads.items() if k != name}}
    named = _read(tmp_path, {**arrays, f"frozen/{name}": np.zeros(0)})
    assert named.frozen == {name}
    assert [r["verdict"] for r in tv.judge(named, bound[2])] == [tv.APPLIED, tv.APPLIED]
    silent = _read(tmp_path, arrays)
    rows = tv.judge(silent, bound[2])
    assert rows[0]["verdict"] != tv.APPLIED and rows[0]["grad_where"] == name, rows  # the final row: its own arithmetic
    with pytest.raises(ValueError, match="frozen"):
        _read(tmp_path, {**arrays, f"grad/{name}": capped.grads[name], f"frozen/{name}": np.zeros(0)})


@pytest.mark.slow
@pytest.mark.engine_environments("mlx-lm")
def test_mlx_lm_trains_gemma2_without_its_window_and_its_cap_gradient_outlives_torchs(bound, tmp_path,
                                                                                       engine_environment):
    """mlx-lm's own Gemma 2 on the MLX CPU build, live: the full fine-tune and the LoRA step both match the model
    without the sliding window (caps applied, gradients within fp32's bound of that model's), the full step names
    the embedding and final norm frozen, and past torch's fp32 first zero (|a/c| ≈ 9) MLX's tanh backward still
    gives a non-zero dL/da: its first zero lies beyond |a/c| = 24."""
    from softcapgrad.engines.forward import runner
    from softcapgrad.engines.training import parity as train_parity
    from softcapgrad.engines.forward.alternatives import WINDOWLESS

    state = engine_environment("mlx-lm")
    model, ids, reference = bound[0], bound[1], bound[2]
    runner.write_ids(tmp_path, ids)
    tr.save_folder(model, tmp_path / "capped")
    folders = ["capped", *train_parity.sweep_folders(model, ids, tmp_path)]
    c = reference.caps["final"]
    for route in (r for r in train_parity.MLX_ROUTES if r.precision == "fp32"):
        rows, steps, info = train_parity._route("mlx-lm", route, state, reference, tmp_path, folders, 300)
        assert info["reason"] is None and "mlx_lm.models.gemma2" in info["did"], info
        assert [(r["verdict"], r.get("form")) for r in rows] == [(tv.DIFFERENT, WINDOWLESS), (tv.APPLIED, None)], rows
        assert all(r["grad_error"] <= r["grad_tolerance"] for r in rows)
        if route.id == "full":
            assert steps["capped"].frozen == {"model.embed_tokens.weight", "model.norm.weight"}
        zero = train_parity.first_zero(list(steps.values()), c, ids)
        assert zero["last_alive"] / c > 24 and (zero["first_dead"] is None or zero["first_dead"] / c > 24), zero


def test_every_eager_route_loads_eager_attention():
    """The loader gives eager attention to route names ending in 'eager': each training route whose description
    says eager must reach it under such a name (eager-bf16 once loaded the default attention, sdpa in transformers
    4.57.6 and 5.0.0, and so trained without the attention cap while its row said eager)."""
    from softcapgrad.engines.training import parity as train_parity

    adapter = _adapter()
    said_eager = [r.id for r in train_parity.ROUTES if 'attn_implementation="eager"' in r.text]
    assert "eager-bf16" in said_eager
    assert all(adapter.loaded_as(route).endswith("eager") for route in said_eager)
    assert not any(adapter.loaded_as(r.id).endswith("eager") for r in train_parity.ROUTES if r.id not in said_eager)


@pytest.mark.slow
@pytest.mark.engine_environments("train-fused")
def test_cut_cross_entropy_keeps_the_final_cap_only_when_it_is_passed(bound, tmp_path, engine_environment):
    """The final cap inside a fused loss, live: Cut Cross-Entropy's CPU implementation with softcap=c trains Gemma 2
    with both caps forward and backward; the same call without softcap (its README's example) ignores the final
    cap while the attention cap, the model's own, stays applied. Its Triton implementation needs a GPU driver. The
    loss hides a, and the head rows show where its compiled cap's gradient dies: at torch-compile-cpu's fp32 first
    zero on this CPU (259.93 here with AVX-512 code, where torch eager's is 270.33)."""
    import torch

    from softcapgrad.engines.training import parity as train_parity
    from softcapgrad.stacks import registry

    state = engine_environment("train-fused")
    reference = _capped_folder(bound, tmp_path)
    design = train_parity.row_folder(bound[0], bound[1], tmp_path)
    routes = {r.id: r for r in train_parity.FUSED_ROUTES}
    expected = {"cce": [tv.APPLIED, tv.APPLIED], "cce-no-softcap": [tv.APPLIED, tv.IGNORED]}
    kept = {}
    for name, verdicts in expected.items():
        folders = ["capped", train_parity.ROWS_FOLDER] if name == "cce" else ["capped"]
        rows, kept[name], info = train_parity._route("fused-loss", routes[name], state, reference, tmp_path, folders,
                                                     300)
        assert info["reason"] is None and "impl='torch_compile'" in info["did"], info
        assert [r["verdict"] for r in rows] == verdicts, rows
        assert all(r["grad_error"] <= r["grad_tolerance"] for r in rows)
    c = reference.caps["final"]
    zero = train_parity.rows_first_zero(kept["cce"][train_parity.ROWS_FOLDER], design, c)
    compiled = registry.first_zero("torch-compile-cpu", "float32", c).value  # measured on this CPU, as CCE compiles
    assert zero["last_alive"] < compiled <= zero["first_dead"], (zero, compiled)
    if not torch.cuda.is_available():
        rows, _, info = train_parity._route("fused-loss", routes["cce-default"], state, reference, tmp_path,
                                            ["capped"], 300)
        assert [r["verdict"] for r in rows] == [tv.NOT_RUN, tv.NOT_RUN] and "active drivers" in info["reason"], info


def _result(engines: dict, models: list[str], seed: int = 0) -> dict:
    """A train-parity.json's shape: ``engines`` maps an engine to the verdict each of its rows holds."""
    rows = [{"engine": e, "route": "r", "model": m, "cap": cap, "verdict": v} for m in models
            for e, v in engines.items() for cap in ("attention", "final")]
    routes = [{"engine": e, "route": "r", "model": m} for m in models for e in engines]
    return {"params": {"seed": seed, "seq_len": 16, "engines": list(engines), "model_types": models},
            "models": [{"model": m} for m in models], "rows": rows, "routes": routes}


def test_an_update_replaces_only_the_engines_and_types_it_measured():
    from softcapgrad.engines.training import results as train_results

    old = _result({"transformers": "old", "litgpt": "old"}, ["gemma2", "nanochat"])
    new = _result({"litgpt": "new"}, ["gemma2", "gemma3_text"])
    merged = train_results.merge(old, new, ["transformers", "litgpt"])
    got = {(r["engine"], r["model"]): r["verdict"] for r in merged["rows"]}
    assert got == {("transformers", "gemma2"): "old", ("litgpt", "gemma2"): "new", ("transformers", "nanochat"): "old",
                   ("litgpt", "nanochat"): "old", ("litgpt", "gemma3_text"): "new"}
    assert [m["model"] for m in merged["models"]] == ["gemma2", "nanochat", "gemma3_text"]
    assert [r["engine"] for r in merged["rows"] if r["model"] == "gemma2"] == ["transformers"] * 2 + ["litgpt"] * 2
    assert len(merged["routes"]) == 5 and train_results.unmergeable(merged) is None


def test_an_update_on_another_cpu_keeps_both_records_and_marks_the_rows_measured_there():
    """A compiled stack's first zero (and so a row's stacks_within) can depend on the CPU: rows merged from a run on
    another CPU than most are marked, and the earlier run's record stays beside the new one."""
    from softcapgrad.engines.training import results as train_results

    def on(cpu: str, result: dict) -> dict:
        record = {"cpu": {"model": cpu, "flags": ["avx2"]}, "date": "2026-12-06", "environments": {}}
        label = f"{cpu} [avx2]"
        return {**result, "rows": [{**r, "cpu": label} for r in result["rows"]], "provenance": record}

    old = on("Planted Xeon", _result({"transformers": "old", "litgpt": "old", "torchtune": "old"}, ["gemma2"]))
    new = on("Planted EPYC", _result({"litgpt": "new"}, ["gemma2"]))
    merged = train_results.merge(old, new, ["transformers", "litgpt", "torchtune"])
    assert {(r["engine"], r.get("other_cpu", False)) for r in merged["rows"]} == {
        ("transformers", False), ("litgpt", True), ("torchtune", False)}
    assert merged["provenance"]["cpu"]["model"] == "Planted EPYC"
    assert [e["cpu"]["model"] for e in merged["provenance"]["earlier"]] == ["Planted Xeon"]
    assert train_results.unmergeable(merged) is None
    text = train_results.markdown({**merged, "models": []}, ())  # the head of the page alone
    assert "; CPU: Planted EPYC (kernel flags: avx2); train-parity.json holds" in text
    assert "Measured on another CPU than the rest (train-parity.json names it per row): litgpt r." in text
    assert "holds a cpu that is not" in train_results.unmergeable({**merged, "rows": [{**merged["rows"][0], "cpu": 1}]})


@pytest.mark.parametrize("content,said", [
    (None, "needs --out"), ("{", "is not JSON"), ('{"rows": []}', "holds no train-parity results"),
    (json.dumps(_result({"litgpt": "v"}, ["gemma2"], seed=7)), "another seed")])
def test_an_update_that_cannot_merge_is_one_line_and_exit_2_before_any_work(cli, tmp_path, content, said):
    args = ["train-parity", "--engine", "litgpt", "--model-type", "gemma2", "--update"]
    if content is not None:
        (tmp_path / "train-parity.json").write_text(content, encoding="utf-8")
        args += ["--out", str(tmp_path)]
    code, _, out, err = cli(*args)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and said in err, err
    if content is not None:
        assert (tmp_path / "train-parity.json").read_text(encoding="utf-8") == content


@pytest.mark.slow
def test_an_update_run_keeps_the_engines_it_did_not_measure(cli, tmp_path):
    """End to end, with no engine environment built (an empty cache: each route a quick 'could not run' row): a run
    of litgpt, then --update with torchtune, leaves both engines' rows in the results, and the answer names both."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = tmp_path / "results"
    out.mkdir()
    code, _, _, err = cli("train-parity", "--engine", "litgpt", "--model-type", "nanochat", "--out", str(out), env=env)
    assert code == 0, err
    code, _, _, err = cli("train-parity", "--engine", "torchtune", "--model-type", "nanochat", "--out", str(out),
                          env=env)
    assert code == 2 and "--update" in err  # a partial run does not replace them
    code, _, _, err = cli("train-parity", "--engine", "torchtune", "--model-type", "nanochat", "--out", str(out),
                          "--update", env=env)
    assert code == 0, err
    data = json.loads((out / "train-parity.json").read_text(encoding="utf-8"))
    assert {r["engine"] for r in data["rows"]} == {"litgpt", "torchtune"}
    assert [u["engines"] for u in data["params"]["updated"]] == [["torchtune"]]
    assert "litgpt" in " ".join(data["answer"]) and "torchtune" in " ".join(data["answer"])


@pytest.mark.slow
@pytest.mark.engine_environments("gemma-jax")
def test_deepmind_gemma_gives_its_own_reason_for_not_training_a_hugging_face_folder(bound, tmp_path,
                                                                                  engine_environment):
    """gemma (JAX) trains from its own checkpoints and ships no reader of a Hugging Face folder: its row says so, as
    read from the installed library, and no converter of ours stands in for it."""
    from softcapgrad.engines.forward import runner
    from softcapgrad.engines.training import parity as train_parity

    state = engine_environment("gemma-jax")
    model, ids, reference = bound[0], bound[1], bound[2]
    runner.write_ids(tmp_path, ids)
    tr.save_folder(model, tmp_path / "capped")
    rows, _, info = train_parity._route("gemma-jax", train_parity.GEMMA_JAX_ROUTES[0], state, reference, tmp_path,
                                        ["capped"], 120)
    assert [r["verdict"] for r in rows] == [tv.NOT_RUN, tv.NOT_RUN]
    assert "ships no converter from Hugging Face weights" in info["reason"], info


def test_a_loss_normalised_by_another_count_is_named_not_blamed_on_a_cap(bound):
    """transformers 4.57.6's Trainer divides the summed loss by every label (n) where the model averages the n − 1
    predictions: the loss, dL/dz and every gradient come out (n − 1)/n of the reference's. Planted here (15/16 at
    n = 16): both caps are still applied, the row carries the scale, and the lone 'nearer' rule no longer passes a
    gradient that misses its only reference."""
    capped = bound[2].steps["capped"]
    s = 15 / 16
    scaled = tr.Step(capped.loss * s, capped.logits, {k: v * s for k, v in capped.grads.items()}, capped.precap,
                     capped.precap_grad * s, capped.logits_grad * s)
    rows = tv.judge(scaled, bound[2])
    assert [r["verdict"] for r in rows] == [tv.APPLIED, tv.APPLIED]
    assert all(r["grad_scale"] == pytest.approx(s, rel=1e-12) for r in rows)
    assert "0.9375 times the reference's" in rows[0]["hint"]
    assert [r.get("grad_scale") for r in tv.judge(capped, bound[2])] == [None, None]
    assert tv.nearest({"exact": 0.5}, 1e-4) == (None, "nearest exact (0.5), no other reference")


# --- the first zero where a is hidden: head rows designed to a chosen input ---------------------------------------


def test_head_rows_give_each_position_its_designed_input_and_show_the_same_first_zero_as_a(bound, tmp_path):
    """Rows of the head set to s_k·u (H·u = 1) give a = s_k at every position, within the rounding of those rows to
    float32; one fp32 step then shows the cap's first zero twice, from a itself and from the rows' gradients alone
    (as a route that hides a would), and both brackets hold torch-eager-cpu's fp32 first zero."""
    import torch
    from transformers import AutoModelForCausalLM

    from softcapgrad.engines.training import parity as train_parity
    from softcapgrad.stacks import registry

    model, ids, reference = bound[0], bound[1], bound[2]
    c = reference.caps["final"]
    design = train_parity.row_folder(model, ids, tmp_path)
    assert design is not None and design.head == "model.embed_tokens.weight"
    assert not set(design.rows) & {int(i) for i in ids}
    pushed = AutoModelForCausalLM.from_pretrained(tmp_path / train_parity.ROWS_FOLDER, attn_implementation="eager")
    seen = []
    hook = pushed.get_output_embeddings().register_forward_pre_hook(lambda m, a: seen.append(a[0].detach()))
    with torch.no_grad():
        pushed(input_ids=torch.as_tensor(ids).reshape(1, -1))
    hook.remove()
    h = seen[0][0].double().numpy()
    w = pushed.get_output_embeddings().weight.detach().double().numpy()[list(design.rows)]
    designed = c * np.geomspace(*train_parity.ROW_SPAN, train_parity.ROWS)
    # each row rounded to float32 moves each product term by at most 2^-24 of its size
    bound_ = 2.0 ** -24 * (np.abs(h) @ np.abs(w).T) + 1e-9 * designed
    assert np.all(np.abs(h @ w.T - designed) <= bound_ + 2.0 ** -40), np.abs(h @ w.T - designed).max()
    step = _trained(bound, pushed.float())
    stack = registry.first_zero("torch-eager-cpu", "float32", c).value
    from_a = train_parity.first_zero([step], c, ids)
    from_rows = train_parity.rows_first_zero(step, design, c)
    for zero in (from_a, from_rows):
        assert zero["first_dead"] is not None and zero["last_alive"] < stack <= zero["first_dead"], zero
    assert from_rows["zeros"] == sum(a >= from_rows["first_dead"] for a in design.least)


def test_the_first_zero_sentence_names_a_route_outside_its_stack_and_the_stacks_within():
    from softcapgrad.engines.training import results as train_results

    row = {"cap": "final", "precision": "fp32", "c": 30.0, "stack_first_zero": 270.325, "model": "gemma2",
           "stack": "torch-eager-cpu (float32)"}
    rows = [{**row, "engine": "a", "route": "r", "first_dead": 270.7, "last_alive": 270.0, "agrees": True},
            {**row, "engine": "kerashub", "route": "jax", "first_dead": 243.2, "last_alive": 236.9, "agrees": False,
             "stacks_within": ["jax-jit-cpu (float32)"]}]
    said = train_results._zeros(rows)
    assert "1 of 2 routes' brackets hold torch-eager-cpu (float32)'s 270.325 (above 270, by 270.7)" in said, said
    assert "not kerashub (jax on gemma2): above 236.9, by 243.2, where jax-jit-cpu (float32) first zero" in said, said
