"""train-parity: one training step per route on parity's tiny models or a saved model's folder (DIR), a verdict per
cap and each route's first zero; --python runs one engine's routes with the user's interpreter."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from softcapgrad.cli.common import (earlier_results, emit, InputError, Json, keep_fuller, pick, Report,
                                   seed_in_range, Wide)
from softcapgrad.cli.limits import Bound, out_folder, path_given, SEED

FILES = ("train-parity.json", "train-parity.md")
DEFAULT_TYPES = ["gemma2", "gemma3_text", "nanochat"]


def _say(line: str) -> None:
    typer.echo(f"softcapgrad train-parity: {line}", err=True)


def _states(names: list[str], install: bool = False) -> dict:
    """Each environment's state: as it is, or with ``install`` built first where it is missing or stale."""
    from softcapgrad.engines.environments import environments
    from softcapgrad.engines.training import routes as train_routes

    states = {}
    for name in names:
        env = train_routes.ENGINES[name]
        if env not in states:
            states[env] = environments.state(env)
            if states[env].state == "untrusted":
                raise InputError(environments.refusal(states[env], name))
            if install and env != environments.MAIN and states[env].state != "installed":
                states[env] = environments.ready(env, True, say=_say, engine=name)
    return states


def _earlier(out: Path | None, seq_len: int, seed: int) -> dict:
    """The results --update merges into, checked before any work: readable, and measured on the same references."""
    from softcapgrad.engines.training.results import unmergeable

    if out is None:
        raise InputError("--update needs --out DIR holding an earlier train-parity.json")
    path = out / FILES[0]
    data = earlier_results(path)
    why = unmergeable(data)
    if why:
        raise InputError(f"--update: {path} cannot be merged into: {why}")
    then = data["params"]
    differs = [k for k, v in (("seed", seed), ("seq_len", seq_len)) if then.get(k) != v]
    if differs:
        raise InputError(f"--update: the earlier results were measured with another {', '.join(differs)} "
                         f"({', '.join(f'{k} {then.get(k)!r}' for k in differs)}): their references differ")
    return data


def train_report(results, params: dict, answer: tuple, written: tuple = ()) -> Report:
    from softcapgrad.core.report import Table
    from softcapgrad.engines.training import results as train_results

    rows = [{k: r.get(k) for k in train_results.ROW_KEYS} for p in results for r in p.rows]
    shown = ("engine", "route", "model", "cpu_s", "wall_s")
    routes = [{**{k: e[k] for k in shown}, "reason": e["reason"] or "", "did": e["did"] or e["how"]}
              for p in results for e in p.routes]
    return Report(
        command="train-parity", params=params,
        tables=(
            Table("rows", "verdict per route and cap (one training step against float64 references)", rows,
                  ("engine", "route", "model", "cap", "verdict", "first_dead"),
                  wide=("form", "precision", "forward_cell", "grad_error", "grad_tolerance", "last_alive",
                        "stack_first_zero", "agrees", "hint")),
            Table("routes", "routes: CPU time (user + system) of the child process, loading included", routes,
                  shown, wide=("reason", "did")),
        ),
        notes=(f"written: {', '.join(map(str, written))}" if written else "nothing written (no --out)",
               "grad error: largest |Δ gradient| over every parameter, relative to the reference's largest; first "
               "zero: the smallest positive final-cap input a whose gradient the route returned as exactly 0"),
        answer=answer,
    )


def train_parity(
    directory: Annotated[Optional[Path], typer.Argument(
        parser=path_given, metavar="[directory]", help="A saved model's folder (config.json, safetensors weights; "
                                                       "never downloaded, no remote code), trained as saved.")] = None,
    model_type: Annotated[Optional[list[str]], typer.Option(
        "--model-type", help="A capped model type parity builds (repeatable; default gemma2, gemma3_text, "
                              "nanochat).")] = None,
    engine: Annotated[Optional[list[str]], typer.Option(
        "--engine", help="transformers, transformers-4, transformers-5.0, peft-trl, torchtune, litgpt, kerashub, "
                         "mlx-lm, fused-loss, gemma-jax, unsloth, axolotl, easydel, penzai, unsloth-zoo-rl or all "
                         "(repeatable; default all). Environments are used as built unless --install.")] = None,
    install: Annotated[bool, typer.Option("--install", help="Build the chosen engines' missing environments "
                                                            "first.")] = False,
    seq_len: Annotated[Optional[int], typer.Option(
        "--seq-len", callback=Bound(2, 512, "the tiny models' positions"),
        help="Tokens of the batch (2 to 512; default 16, and with DIR's tokenizer the whole text up to 512).")] = None,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", parser=path_given, metavar="<path>", help="With DIR: a UTF-8 text file, one prompt per line, "
                                                                "tokenized by DIR's tokenizer.json in place of the "
                                                                "shipped text.")] = None,
    python: Annotated[Optional[Path], typer.Option(
        "--python", parser=path_given, metavar="<path>", help="An interpreter of your own (your training stack, an "
                                                               "older release) to run the one --engine with.")] = None,
    seed: Annotated[Optional[int], typer.Option(callback=SEED, help="Seed of the weights and token ids (0 to "
                                                                    "2^63 − 1; default 0).")] = None,
    timeout: Annotated[float, typer.Option(callback=Bound(1.0, 3600.0, "seconds each training route may take"),
                                           help="Seconds each route may take, loading included (1 to 3600).")] = 120.0,
    jobs: Annotated[int, typer.Option(callback=Bound(1, 16, "each route's child holds a model and its trainer"),
                                      help="Routes run at a time (1 to 16).")] = 1,
    out: Annotated[Optional[Path], typer.Option(parser=path_given, callback=out_folder, metavar="<path>",
                                                help="Folder for train-parity.json and train-parity.md (default and "
                                                     "'none': nothing written).")] = None,
    update: Annotated[bool, typer.Option(
        "--update", help="Replace only the engines and model types measured now in --out's results; keep the "
                         "rest.")] = False,
    repro: Annotated[Optional[Path], typer.Option(
        "--repro", parser=path_given, metavar="<path>", help="A new (or empty) folder: a reproduction bundle for "
                                                              "every training route with a finding.")] = None,
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """Does training keep the caps: one training step per route on parity's tiny models or a saved model's folder
    (DIR), its loss and gradients against float64 references, a verdict per cap, and where the route's final-cap
    gradient is first exactly 0."""

    def build() -> Report:
        import importlib.util

        if python is not None:  # every path is read before anything else; the probe runs once the engine is known
            from softcapgrad.engines.forward import interpreter

            interpreter.runnable(python)
        if importlib.util.find_spec("transformers") is None:
            raise InputError("train-parity needs transformers: pip install 'softcapgrad[hf]'")
        import json

        from softcapgrad.core import progress
        from softcapgrad.core.files import check_targets, replace_all, writable_folder
        from softcapgrad.engines.environments.environments import FORMER
        from softcapgrad.engines.forward import modeltypes, reference, runner
        from softcapgrad.engines.forward.folder import read_prompts
        from softcapgrad.engines.training import folder, parity as run, results as train_results
        from softcapgrad.models import audit

        names = pick("--engine", engine, tuple(run.ENGINES), former=FORMER)
        explicit = bool(engine) and not any(e.strip().lower() == "all" for e in engine)
        if directory is not None and model_type:
            raise InputError("--model-type does not go with a model directory: DIR's config.json names its type")
        if directory is None and prompts is not None:
            raise InputError("--prompts needs a model directory DIR whose tokenizer.json reads them")
        lines = read_prompts(prompts) if prompts is not None else None  # parity DIR's reader
        types = [str(directory)] if directory is not None else pick("--model-type", model_type, reference.SUPPORTED,
                                                                     DEFAULT_TYPES)
        s = seed_in_range(seed)
        if out is not None:
            writable_folder(out, "--out")
            check_targets([out / name for name in FILES], "--out")
            if not update:
                keep_fuller(out / FILES[0], {"engines": names, "model_types": types},
                            "a partial run does not replace them (--update replaces only what it measures, or give "
                            "another --out)")
        if repro is not None:
            from softcapgrad.engines.repro import training as train_repro

            train_repro.target(repro)
        if directory is not None:
            sources = [(str(directory), audit.source(directory, None, []))]
            folder.has_type(names, sources[0][1].config.model_type)
        else:
            sources = [(t, audit.source(None, modeltypes.model_type(t), reference.tiny_sets(t))) for t in types]
        for _, src in sources:
            reference.check(src.config)
        facts, states = (folder.given_python(python, names, explicit, install) if python is not None
                         else (None, None))
        n, given, said = seq_len or folder.STAND_IN, None, ""
        if directory is not None:  # the model and its inputs, before any route runs
            ids, said = folder.inputs(directory, src.config, lines, seq_len, s)
            n, given = int(ids.size), (folder.load(src), ids)
        earlier = _earlier(out, n, s) if update else None
        states = states or _states(names, install)
        import dataclasses

        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            results = []
            with runner.terminations(), progress.task("train-parity: routes",
                                                      sum(len(run.routes(n)) for n in names) * len(sources)) as advance:
                for label, src in sources:
                    results.append(dataclasses.replace(run.measure(src, label, names, states, n, s, timeout, advance,
                                                                   jobs, given), inputs=said))
        finally:
            torch.set_num_threads(threads)
        folder.note_interpreter(results, facts)
        from softcapgrad.engines.forward.parity import private  # the results are shared: no home folder in them

        params = {"model_types": types, "engines": names, "seq_len": n, "seed": s, "timeout": timeout,
                  **({"prompts": str(prompts)} if prompts else {}),
                  **({"python": private(facts["path"])} if facts else {})}
        from softcapgrad.cli.parity_runs import provenance

        data = train_results.as_dict(results, params, provenance(states, facts))
        if earlier is not None:
            data = train_results.merge(earlier, data, list(run.ENGINES))
            data["params"] = {**earlier["params"], "updated": earlier["params"].get("updated", []) + [params]}
        said = train_results.answer(data)
        written: list = []
        if out is not None:
            written = replace_all({out / FILES[0]: json.dumps({**data, "answer": list(said)}, indent=1,
                                                              sort_keys=True) + "\n",
                                   out / FILES[1]: train_results.markdown(data, said)}, out)
        bundles = train_repro.write(repro, results) if repro is not None else []
        return train_report(results, params, said, tuple(written) + tuple(bundles))

    emit(build, json_out, wide, command="train-parity")
