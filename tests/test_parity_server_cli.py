"""softcapgrad parity DIR --server URL through the real command line: a real llama_cpp.server on 127.0.0.1 (skipped
until the llamacpp environment is installed), servers in a thread here that answer true, broken or hostile, and the
refusals checked before any work."""

from __future__ import annotations

import itertools
import json
import socket
import time

import numpy as np
import pytest

from test_engine_llamacpp_vllm import inputs, installed
from test_engine_server import llama_server
from test_server_hostile import _json, completions, listening, MODELS

pytest.importorskip("transformers")


@pytest.mark.parametrize("args, said", [
    (["--server", "ftp://host/"], "--server 'ftp://host/'"),
    (["DIR", "--server", "http://[::1"], "--server 'http://[::1': not an address (Invalid IPv6 URL)"),
    (["DIR", "--server", "http://:8000"], "--server 'http://:8000': the address names no host"),
    (["--server", "http://127.0.0.1:1"], "--server needs the model directory DIR"),
    (["DIR", "--server", "http://127.0.0.1:1", "--engine", "llamacpp"], "--engine does not apply with --server"),
    (["DIR", "--server-model", "m"], "--server-model needs --server URL"),
    (["DIR", "--server", "http://127.0.0.1:1", "--set", "final_logit_softcapping=20"],
     "--set does not apply with --server"),
])
def test_server_refusals_are_one_line_and_exit_2(cli, tmp_path, args, said):
    code, _, out, err = cli("parity", *[str(tmp_path) if a == "DIR" else a for a in args])
    assert code == 2 and out == "" and said in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("listening, said", [(False, "refused"), (True, "no answer in 1 s")])
def test_a_closed_port_or_a_silent_server_is_a_row_with_its_reason_and_exit_4(cli, tmp_path, listening, said):
    _, folder = inputs(tmp_path, "gemma2", "final_logit_softcapping=30", "attn_logit_softcapping=50")
    with socket.socket() as s:  # bound only: connections refused; listening: accepted, never read
        s.bind(("127.0.0.1", 0))
        if listening:
            s.listen(4)
        port = s.getsockname()[1]
        code, data, _, err = cli("parity", str(folder / "capped"), "--server", f"http://127.0.0.1:{port}", "--json",
                                 "--timeout", "1")
    assert code == 4, err  # no cap judged (NO_VERDICT)
    assert [r["verdict"] for r in data["rows"]] == ["could not run", "could not run"]
    assert all(said in r["note"].lower() for r in data["rows"]), data["rows"]
    assert data["answer"][0].startswith(f"The server at http://127.0.0.1:{port} gave nothing to judge a cap on: ")


def test_parity_server_judges_a_real_llama_cpp_server(cli, tmp_path):
    python = installed("llamacpp")
    _, folder = inputs(tmp_path, "gemma2", "final_logit_softcapping=30", "attn_logit_softcapping=50")
    with llama_server(python, folder / "capped", tmp_path) as url:
        code, data, _, err = cli("parity", str(folder / "capped"), "--server", url + "/v1", "--json",
                                 "--timeout", "60")
        text_code, _, text, _ = cli("parity", str(folder / "capped"), "--server", url, "--timeout", "60")
    assert code == 0 and text_code == 0, err
    rows = {r["cap"]: r for r in data["rows"]}
    assert rows["final"]["verdict"] == "applied" and rows["attention"]["verdict"] == "applied"
    assert rows["final"]["top_k"] == 20 and "off by one" in rows["final"]["note"]
    assert rows["final"]["error"] * 10 < rows["final"]["error_off"]
    assert text.startswith("The server at " + url) and "top 20" in text


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny capped Gemma 2 folder, the capped reference's log-probabilities for the prompt parity --server asks
    (seed 0, 16 tokens) as serving.check builds it, and the folder's token pieces."""
    from softcapgrad.engines.forward import reference as ref, verdict
    from softcapgrad.engines.forward.vocabulary import vocabulary
    from softcapgrad.models import audit

    _, folder = inputs(tmp_path_factory.mktemp("served"), "gemma2", "final_logit_softcapping=30",
                       "attn_logit_softcapping=50")
    src = audit.source(folder / "capped", None, [])
    ids = audit.random_ids(src.config, 1, 16, 0).numpy().reshape(-1)
    logits = ref.reference(ref.build(src, 0), ids, {}).logits["capped"]
    return str(folder / "capped"), verdict.log_probs(logits), list(vocabulary(src.config.to_dict()).pieces)


def _vllm_form(values: np.ndarray, pieces: list[str], keep, k: int = 20) -> dict:
    """vLLM's prompt_logprobs form of ``values``' top k per row; rows not in ``keep`` are returned empty."""
    def top(row):
        return np.argsort(row)[::-1][:k]

    prompt = [None] + [{str(j): {"logprob": float(row[j]), "rank": 1} for j in top(row)} if keep(t) else {}
                       for t, row in enumerate(values[:-1])]
    last = {pieces[j]: float(values[-1, j]) for j in top(values[-1])}
    return {"choices": [{"prompt_logprobs": prompt, "logprobs": {"top_logprobs": [last]}}]}


def _parity(cli, folder, answer):
    with listening(answer) as url:
        started = time.monotonic()
        code, data, _, err = cli("parity", folder, "--server", url, "--json", "--timeout", "2")
        return code, data, err, url, time.monotonic() - started


def test_a_true_server_is_judged_and_fewer_positions_are_said(cli, served):
    folder, values, pieces = served
    answer = _vllm_form(values, pieces, lambda t: t >= 12)  # rows 12, 13, 14 and the generated step's
    code, data, err, _, _ = _parity(cli, folder, lambda path, body: _json(MODELS if path == "/v1/models" else answer))
    assert code == 0, err
    assert [r["verdict"] for r in data["rows"]] == ["applied", "applied"]
    assert all(r["error"] < 1e-9 for r in data["rows"])  # the reference itself, through JSON's exact floats
    assert data["answer"][0].endswith("judged on the top 20 log-probabilities it returned at only 4 of the 16 "
                                      "positions asked.")
    assert all(r["note"].endswith("judged at 4 of the 16 positions asked") for r in data["rows"])


def test_nan_log_probabilities_but_at_one_position_get_no_verdict_and_exit_4(cli, served):
    folder, values, pieces = served
    values = values.copy()
    values[:-1] = np.nan  # one true position (the last) among 16: once enough for a verdict
    answer = _vllm_form(values, pieces, lambda t: True)
    code, data, err, url, _ = _parity(cli, folder, lambda path, body: _json(MODELS if path == "/v1/models" else answer))
    assert code == 4, err
    assert [r["verdict"] for r in data["rows"]] == ["not judged", "not judged"]
    said = "the server's values are not log-probabilities: 300 of the 320 returned are not finite (NaN or ±inf)"
    assert all(r["note"] == said for r in data["rows"])
    assert data["answer"][0] == f"The server at {url} gave nothing to judge a cap on: {said}."


def test_an_answer_of_another_shape_is_a_reason_and_exit_4(cli, served):
    code, data, err, _, _ = _parity(cli, served[0], completions("abc"))
    assert code == 4, err
    assert [r["verdict"] for r in data["rows"]] == ["could not run", "could not run"]
    said = "prompt_logprobs (K=20): /v1/completions: the server's `choices` is a string, not a list"
    assert all(r["note"] == said for r in data["rows"]) and said in data["answer"][0], data["rows"]


def test_a_trickling_server_ends_the_command_at_its_timeout(cli, served):
    trickle = itertools.chain([json.dumps(MODELS).encode()], itertools.repeat(b" ", 400))  # 20 s at most
    code, data, err, _, took = _parity(cli, served[0], lambda path, body: (200, {}, trickle))
    assert code == 4 and data["rows"][0]["note"] == "/v1/models: no answer in 2 s", err
    assert took < 2 + 6  # the deadline, and the reference's build (about a second here) with room for a busy machine


def test_parity_with_no_engine_run_claims_no_cap_applied():
    from softcapgrad.cli.parity_report import answer_of as _answer

    def row(cap, verdict):
        return {"engine": "onnx", "route": "fp32", "model": "gemma2", "cap": cap, "verdict": verdict}

    data = {"models": [{"model": "gemma2", "reach": {"attention": 4.0, "final": 4.0}}],
            "rows": [row("attention", "could not run"), row("final", "could not run")]}
    first, second, third = _answer(data)
    assert first.startswith("No engine ran, so no cap was judged (") and "Every engine" not in first
    assert second == "Applied by: none." and third.startswith("Could not run somewhere (rows give why): onnx.")
    data["rows"][1]["verdict"] = "applied"
    assert _answer(data)[0].startswith("Every engine that ran applied every cap it was given")
