"""softcapgrad parity DIR --server URL through the real command line: a real llama_cpp.server on 127.0.0.1 (skipped
until the llamacpp environment is installed), and the refusals checked before any work."""

from __future__ import annotations

import socket

import pytest

from test_engine_llamacpp_vllm import inputs, installed
from test_engine_server import llama_server

pytest.importorskip("transformers")


@pytest.mark.parametrize("args, said", [
    (["--server", "ftp://host/"], "--server 'ftp://host/'"),
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
def test_a_closed_port_or_a_silent_server_is_a_row_with_its_reason_and_exit_0(cli, tmp_path, listening, said):
    _, folder = inputs(tmp_path, "gemma2", "final_logit_softcapping=30", "attn_logit_softcapping=50")
    with socket.socket() as s:  # bound only: connections refused; listening: accepted, never read
        s.bind(("127.0.0.1", 0))
        if listening:
            s.listen(4)
        port = s.getsockname()[1]
        code, data, _, err = cli("parity", str(folder / "capped"), "--server", f"http://127.0.0.1:{port}", "--json",
                                 "--timeout", "1")
    assert code == 0, err
    assert [r["verdict"] for r in data["rows"]] == ["could not run", "could not run"]
    assert all(said in r["note"].lower() for r in data["rows"]), data["rows"]
    assert data["answer"][0].startswith(f"The server at http://127.0.0.1:{port} gave no log-probabilities")


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
