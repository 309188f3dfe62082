"""Output targets: only a regular file or a new name in a folder that takes files is ever written,
checked before any computation, and replaced whole; reproduce holds SIGTERM as it holds SIGINT.

Every refusal is one line and exit 2. The computations are replaced by ones that fail loudly, so a
target checked only after computing shows up as an internal error (exit 3), not as a slow test.
"""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from softcapgrad.core import files
from softcapgrad.core.checks import InputError

RUN = [sys.executable, "-m", "softcapgrad"]
PROC = Path("/proc")
needs_proc = pytest.mark.skipif(not (PROC / "self").is_dir(), reason="no /proc file system here")


def _never(*args, **kwargs):
    raise AssertionError("computed before the output target was checked")


def _one_line(code: int, out: str, err: str) -> str:
    assert code == 2 and out == "", (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _nodes(tmp_path: Path) -> dict[str, Path]:
    """A regular file, and beside it one of each node a target must not replace."""
    (tmp_path / "kept.png").write_text("kept")
    nodes = {"symlink": tmp_path / "link.png", "dangling": tmp_path / "dangling.png", "fifo": tmp_path / "fifo.png",
             "folder": tmp_path / "folder.png"}
    nodes["symlink"].symlink_to(tmp_path / "kept.png")
    nodes["dangling"].symlink_to(tmp_path / "nowhere.png")
    os.mkfifo(nodes["fifo"])
    nodes["folder"].mkdir()
    return nodes


WORDS = {"symlink": "symbolic link", "dangling": "symbolic link", "fifo": "FIFO", "folder": "folder"}


def _unchanged(tmp_path: Path, nodes: dict[str, Path]) -> None:
    assert (tmp_path / "kept.png").read_text() == "kept"
    assert nodes["symlink"].is_symlink() and nodes["dangling"].is_symlink() and not (tmp_path / "nowhere.png").exists()
    assert nodes["fifo"].is_fifo() and nodes["folder"].is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")], "no temporary file left"


@pytest.mark.parametrize("kind", list(WORDS))
def test_plot_refuses_a_node_that_is_not_a_regular_file(cli, tmp_path, monkeypatch, kind):
    pytest.importorskip("matplotlib")
    from softcapgrad.laws import attenuation

    monkeypatch.setattr(attenuation, "identity_report", _never)
    nodes = _nodes(tmp_path)
    code, _, out, err = cli("identity", "--plot", str(nodes[kind]), "--json")
    assert WORDS[kind] in _one_line(code, out, err)
    _unchanged(tmp_path, nodes)


def test_the_writer_itself_never_replaces_a_link_fifo_or_folder(tmp_path):
    nodes = _nodes(tmp_path)
    for kind, node in nodes.items():
        with pytest.raises(InputError, match=WORDS[kind]):
            files.write_atomic(node, "new")
        with pytest.raises(InputError, match=WORDS[kind]):
            files.replace_all({tmp_path / "new.txt": "new", node: "new"}, tmp_path / "out")
    assert not (tmp_path / "new.txt").exists(), "a set with one bad target replaces none"
    _unchanged(tmp_path, nodes)
    files.write_atomic(tmp_path / "kept.png", "replaced")  # a regular file is replaced as before
    assert (tmp_path / "kept.png").read_text() == "replaced"


def test_a_device_node_is_refused_by_every_writer(cli, tmp_path):
    """A device node of the test's own (the null device's numbers, made in tmp_path), never a system one:
    a writer that replaced it would otherwise replace the machine's /dev/null."""
    node = tmp_path / "device.json"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, AttributeError, OSError):
        pytest.skip("cannot make a device node here (needs root)")
    with pytest.raises(InputError, match="character device"):
        files.write_atomic(node, "new")
    code, _, out, err = cli("stacks", "--record", str(node))  # refused before the CUDA check, whatever the machine
    assert "character device" in _one_line(code, out, err)
    assert node.is_char_device()


@needs_proc
@pytest.mark.parametrize("target", ["/proc/x.png", "/proc/self/x.png"])
def test_plot_into_proc_is_refused_before_computing(cli, monkeypatch, target):
    pytest.importorskip("matplotlib")
    from softcapgrad.laws import attenuation

    monkeypatch.setattr(attenuation, "identity_report", _never)
    code, _, out, err = cli("identity", "--plot", target, "--json")
    assert f"cannot write in {Path(target).parent}" in _one_line(code, out, err)


@needs_proc
def test_plot_into_proc_keeps_the_json_answer_path_clean():
    """The real command in a child: exit 2 at once, nothing on stdout, one line on stderr (was exit 3
    after the whole computation, the JSON lost)."""
    pytest.importorskip("matplotlib")
    proc = subprocess.run([*RUN, "ratchet", "--plot", "/proc/x.png", "--json"], capture_output=True, text=True,
                          timeout=120)
    assert "cannot write in /proc" in _one_line(proc.returncode, proc.stdout, proc.stderr)


@needs_proc
def test_census_out_into_proc_is_refused_before_computing(cli, monkeypatch):
    pytest.importorskip("transformers")
    from softcapgrad.models import census

    monkeypatch.setattr(census, "census", _never)
    code, _, out, err = cli("census", "--out", "/proc/x", "--model-type", "gemma2", "--json")
    assert "cannot write in /proc" in _one_line(code, out, err)


def test_census_refuses_a_linked_result_before_computing(cli, tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from softcapgrad.models import census

    monkeypatch.setattr(census, "census", _never)
    (tmp_path / "elsewhere.md").write_text("kept")
    (tmp_path / "census.md").symlink_to(tmp_path / "elsewhere.md")
    code, _, out, err = cli("census", "--out", str(tmp_path), "--model-type", "gemma2", "--json")
    assert "census.md: is a symbolic link" in _one_line(code, out, err)
    assert (tmp_path / "census.md").is_symlink() and (tmp_path / "elsewhere.md").read_text() == "kept"


def test_reproduce_refuses_a_linked_ledger_before_computing(cli, tmp_path, monkeypatch):
    from softcapgrad.ledger import verdicts

    monkeypatch.setattr(verdicts, "evaluate", _never)
    (tmp_path / "mine.json").write_text("kept")
    (tmp_path / "claims.json").symlink_to(tmp_path / "mine.json")
    code, _, out, err = cli("reproduce", "--out", str(tmp_path), "--only", "^attenuation", "--force")
    assert "claims.json: is a symbolic link" in _one_line(code, out, err)
    assert (tmp_path / "mine.json").read_text() == "kept" and (tmp_path / "claims.json").is_symlink()


@pytest.mark.parametrize("argv", [["identity", "--plot", "{long}.png"],
                                  ["identity", "--plot", "{long}/x.png"],
                                  ["reproduce", "--only", "^attenuation", "--force", "--out", "{long}"]])
def test_a_name_over_255_bytes_is_refused_before_computing(cli, tmp_path, monkeypatch, argv):
    pytest.importorskip("matplotlib")
    from softcapgrad.laws import attenuation
    from softcapgrad.ledger import verdicts

    monkeypatch.setattr(attenuation, "identity_report", _never)
    monkeypatch.setattr(verdicts, "evaluate", _never)
    long = str(tmp_path / ("é" * 128))  # 256 bytes in UTF-8 (128 characters: a limit in characters would pass it)
    code, _, out, err = cli(*[a.format(long=long) for a in argv])
    assert "bytes long; at most 255" in _one_line(code, out, err)


def test_a_name_just_within_255_bytes_is_written(tmp_path):
    """The temporary name beside the target is cut to fit, so the longest legal name still works."""
    target = tmp_path / ("n" * 251 + ".png")
    files.write_atomic(target, b"png")
    assert target.read_bytes() == b"png" and [p.name for p in tmp_path.iterdir()] == [target.name]


def test_plot_needs_an_existing_folder(cli, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from softcapgrad.laws import attenuation

    monkeypatch.setattr(attenuation, "identity_report", _never)
    code, _, out, err = cli("identity", "--plot", str(tmp_path / "missing" / "x.png"))
    assert "does not exist" in _one_line(code, out, err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a folder without write permission")
def test_plot_into_a_folder_without_write_permission_is_refused(cli, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from softcapgrad.laws import attenuation

    monkeypatch.setattr(attenuation, "identity_report", _never)
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    try:
        code, _, out, err = cli("identity", "--plot", str(folder / "x.png"))
        assert "cannot write in" in _one_line(code, out, err)
    finally:
        folder.chmod(0o755)


# --- reproduce: SIGTERM held like SIGINT; its stage ignored by git -------------------------------------

CHILD = """
import os, signal, sys
from softcapgrad.core import files
from softcapgrad.cli.app import main

out, phase = sys.argv[1], sys.argv[2]
real_replace, real_write, moved, staged = os.replace, files.write_atomic, [], []

def replace(src, dst):  # the first move of a result into place
    if phase == "moving" and not moved and os.path.dirname(dst) == out:
        moved.append(dst)
        os.kill(os.getpid(), signal.SIGTERM)
    real_replace(src, dst)

def write(path, data):  # the second staged file
    staged.append(path)
    if phase == "writing" and len(staged) == 2:
        os.kill(os.getpid(), signal.SIGTERM)
    real_write(path, data)

files.os.replace, files.write_atomic = replace, write
sys.argv = ["softcapgrad", "reproduce", "--out", out, "--only", "^attenuation", "--force"]
main()
"""


@pytest.mark.parametrize("phase, message, new", [
    ("moving", "softcapgrad: terminated after all 3 file(s) were replaced (the set is whole): {out}/claims.json, "
               "{out}/claims.md, {out}/claims.raw.json", True),
    ("writing", "softcapgrad: terminated before any file was replaced; 3 file(s) left as they were", False),
])
def test_sigterm_during_reproduce_leaves_the_set_whole(tmp_path, phase, message, new):
    out = tmp_path / "results"
    out.mkdir()
    for name in ("claims.json", "claims.md", "claims.raw.json"):
        (out / name).write_text("old")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), phase], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM and proc.stderr.strip() == message.format(out=out), (
        proc.returncode, proc.stderr)
    texts = [(out / name).read_text() for name in ("claims.json", "claims.md", "claims.raw.json")]
    assert all(t != "old" for t in texts) if new else all(t == "old" for t in texts)
    if new:
        assert json.loads(texts[0])["claims"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"], "no stage left beside --out"


def test_the_stage_and_temporary_files_are_ignored_by_git(tmp_path, monkeypatch):
    root = Path(__file__).resolve().parent.parent
    git = shutil.which("git")
    if git is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    names = []
    real_dir, real_file = files.tempfile.mkdtemp, files.tempfile.mkstemp
    monkeypatch.setattr(files.tempfile, "mkdtemp", lambda **kw: names.append(kw) or real_dir(**kw))
    monkeypatch.setattr(files.tempfile, "mkstemp", lambda **kw: names.append(kw) or real_file(**kw))
    files.replace_all({tmp_path / "results" / "claims.json": "{}"}, tmp_path / "results")
    files.write_atomic(tmp_path / "claims.json", "{}")
    stage, staged = names[0], names[-1]
    relative = [f"{stage['prefix']}k3j9x0ab{stage['suffix']}",  # as `reproduce` stages beside results/
                f"{stage['prefix']}k3j9x0ab{stage['suffix']}/0.json",
                f"results/{staged['prefix']}q8w2e4rt{staged['suffix']}"]
    proc = subprocess.run([git, "check-ignore", "--no-index", "--verbose", *relative], cwd=root, capture_output=True,
                          text=True, timeout=60)
    ignored = {line.split("\t")[-1] for line in proc.stdout.splitlines()}
    assert ignored == set(relative), proc.stdout + proc.stderr
