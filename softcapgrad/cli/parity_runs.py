"""What the parity command needs beside its options: a model folder's inputs (its prompts, checks and tokens), the
earlier results --update merges into, the interpreter --python gives, the reproduction bundles --repro writes, and
the provenance parity.json records."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from softcapgrad.cli.common import earlier_results, InputError, not_with
from softcapgrad.engines.forward.folder import RANDOM_TOKENS  # --seq-len's default for random token ids


def folder_inputs(src, texts: tuple | None, bind: bool, seq_len: int | None, seed: int, jobs: int = 1):
    """The folder's inputs once its config is read (models/source.py, config first): the memory its weights'
    headers say the run needs, every parameter in them, then the prompts (``texts``: folder.prompts_given, read
    before the folder) tokenized by its tokenizer.json; with --bind, random ids and the weights rescaled."""
    from softcapgrad.engines.forward import folder
    from softcapgrad.engines.forward.reference import TARGET

    folder.check_memory(src.directory, jobs)
    folder.check_complete(src.directory, src.config, bind)
    if bind:
        n = seq_len or RANDOM_TOKENS
        return folder.Inputs(None, f"{n} random token ids (seed {seed}), the weights rescaled so that each cap "
                                   f"reaches |a/c| = {TARGET:g} (--bind)", tokenizer=False, bound=True)
    prompts, said, given = texts
    return folder.inputs(src, prompts, said, given, seq_len, seed)


def earlier(out) -> dict:
    """The parity results ``--update`` merges into, checked before any work."""
    if out is None:
        raise InputError("--update needs --out DIR holding an earlier parity.json")
    data = earlier_results(out / "parity.json")
    if not (isinstance(data, dict) and all(isinstance(data.get(k), list) for k in ("models", "rows", "engines"))
            and isinstance(data.get("params"), dict)):
        raise InputError(f"--update: {out / 'parity.json'} holds no parity results (models, rows, engines)")
    from softcapgrad.engines.forward.parity import unmergeable

    why = unmergeable(data)
    if why:
        raise InputError(f"--update: {out / 'parity.json'} cannot be merged into: {why}")
    return data


def given_python(python: Path, names: list[str], explicit: bool, install: bool, types: list[str]) -> tuple:
    """--python PATH: the one engine asked for, run by that interpreter once the probe finds its modules there;
    (the probe's facts, the states to measure with)."""
    from softcapgrad.engines.forward import catalog, interpreter

    if not explicit or len(names) != 1:
        raise InputError("--python runs one engine's adapter: give exactly one --engine NAME with it")
    not_with({"--install": install or None}, "with --python: the interpreter given is used as it is")
    engine = catalog.engines()[names[0]]
    if engine.types is not None and types and not any(t in engine.types for t in types):
        raise InputError(f"engine {engine.name} converts {', '.join(engine.types)}, not {', '.join(types)}: "
                         "nothing to run")
    facts = interpreter.probe(python, engine.adapter, engine.name)
    return facts, {engine.environment: interpreter.state(facts, engine.environment)}


def note_interpreter(results: list, facts: dict | None) -> None:
    """Each engine entry run by the --python interpreter names it and its sys.version."""
    if facts is None:
        return
    for p in results:
        for e in p.engines:
            e.update(interpreter=facts["path"], python=facts["version"], environment=f"--python {facts['path']}")


def provenance(states: dict, facts: dict | None) -> dict:
    from softcapgrad.engines.environments import provenance as prov

    return prov.record(states, prov.read_cpu(), facts)


@contextlib.contextmanager
def bundles(repro: Path | None):
    """The stage the bundles are written in (None without --repro): removed on every way out but success, when it
    becomes DIR with one rename (``place``)."""
    if repro is None:
        yield None
        return
    from softcapgrad.engines.repro import report as repro_report

    staged = repro_report.stage(repro)
    try:
        yield staged
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def place(staged: Path | None, repro: Path | None, results: list, states: dict, facts: dict | None) -> list:
    """Every bundle written into the stage, then the stage put in place as DIR; the bundles."""
    if staged is None:
        return []
    from softcapgrad.engines.repro import report as repro_report
    from softcapgrad.engines.forward import runner

    with runner.terminations():  # SIGTERM unwinds like Ctrl-C, so ``bundles`` removes the stage
        written = repro_report.write_all(staged, results, states, facts)
    shutil.rmtree(staged / ".work", ignore_errors=True)
    repro_report.put_in_place(staged, repro)
    return written
