"""softcapgrad.DeadZoneCallback in a real transformers Trainer: a tiny Gemma 2 trained 4 steps on the CPU."""

import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

import softcapgrad  # noqa: E402
from monitoring import KNEE, Capture, confident, ids, tiny  # noqa: E402


class Marks(TrainerCallback):
    """Where each optimizer step's tanh calls start and end in the capture (the model's forward and backward only:
    the monitor's own first-zero lookup runs tanh too, at step end)."""

    def __init__(self, capture):
        self.capture, self.steps, self.logged = capture, [], []

    def on_step_begin(self, args, state, control, **kwargs):
        self.steps.append([len(self.capture.calls)])

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.steps[-1].append(len(self.capture.calls))

    def on_log(self, args, state, control, logs=None, **kwargs):  # as a reporting integration sees the logs
        self.logged.append(sorted(k for k in logs if k.startswith("dead_zone/")))


def _data(n: int = 8):
    batch = ids(shape=(n, 12))
    return [{"input_ids": row, "labels": row} for row in batch]


def _train(tmp_path, callback, model, extra=()):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=2, logging_steps=1,
                             learning_rate=1e-2, report_to="none", save_strategy="no", use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=_data(), callbacks=[*extra, callback])
    trainer.train()
    return trainer


def _expected(calls) -> dict[str, float]:
    """The brute force: per module, tanh inputs at or past the knee over all elements, and the total."""
    past, count = {}, {}
    for module, x, _ in calls:
        past[module] = past.get(module, 0) + int((x.abs().float() >= KNEE).sum())
        count[module] = count.get(module, 0) + x.numel()
    out = {f"dead_zone/{m}/tanh": past[m] / count[m] for m in past}
    out["dead_zone/total"] = sum(past.values()) / sum(count.values())
    return out


@pytest.mark.slow
def test_callback_logs_dead_zone_fractions_of_every_other_step(tmp_path, monkeypatch):
    model = confident(tiny("gemma2"))
    capture = Capture(model, monkeypatch)
    marks = Marks(capture)
    callback = softcapgrad.DeadZoneCallback(every=2)
    trainer = _train(tmp_path, callback, model, extra=[marks])
    assert trainer.callback_handler.callbacks[0] is callback  # first, so that the integrations see its values
    steps = {entry["step"]: entry for entry in trainer.state.log_history if "loss" in entry}
    assert sorted(steps) == [1, 2, 3, 4]
    for step in (1, 3):  # global steps 0 and 2 were watched: logged as steps 1 and 3
        got = {k: v for k, v in steps[step].items() if k.startswith("dead_zone/")}
        start, end = marks.steps[step - 1]
        expected = _expected(capture.calls[start:end])
        assert got == expected and 0 < got["dead_zone/total"] < 1
        assert set(got) == {"dead_zone/total", "dead_zone/Gemma2ForCausalLM/tanh",
                            "dead_zone/model.layers.0.self_attn/tanh", "dead_zone/model.layers.1.self_attn/tanh"}
    for step in (2, 4):
        assert not any(k.startswith("dead_zone/") for k in steps[step])
    assert steps[1] != steps[3]  # the weights moved between the watched steps
    assert [bool(keys) for keys in marks.logged[:4]] == [True, False, True, False]  # callbacks listed before it


def test_callback_patch_applies_at_train_begin_and_is_removed_at_train_end(tmp_path):
    model = tiny("gemma2")
    seen = []

    class Look(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, **kwargs):
            seen.append("forward" in model.__dict__)

    _train(tmp_path, softcapgrad.DeadZoneCallback(every=4, patch=True), model, extra=[Look()])
    assert seen == [True] * 4 and "forward" not in model.__dict__
    with pytest.raises(ValueError, match="every must be"):
        softcapgrad.DeadZoneCallback(every=0)


def test_callback_is_a_lazy_public_name():
    import subprocess
    import sys

    from softcapgrad.integrations import trainer

    assert softcapgrad.DeadZoneCallback is trainer.DeadZoneCallback and "DeadZoneCallback" in softcapgrad.__all__
    code = "import sys, softcapgrad; print('transformers' in sys.modules, 'torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split() == ["False", "False"]
