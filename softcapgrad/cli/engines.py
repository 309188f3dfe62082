"""parity: the same weights through the transformers reference and each export or serving engine."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from softcapgrad.cli.common import (emit, InputError, Json, keep_fuller, NO_VERDICT, not_with, pick, Report, result_set,
                                   seed_in_range, Wide)
from softcapgrad.cli.limits import Bound, out_folder, path_given, SEED
from softcapgrad.cli.parity_report import answer_of, parity_report

FILES = ("parity.json", "parity.md", "figures/parity.png")


def _say(line: str) -> None:
    typer.echo(f"softcapgrad engines: {line}", err=True)


def _plan(names: list[str], types: list[str], explicit: bool, install: bool, jobs: int = 1) -> dict:
    """Each environment's state, installed first where asked (``jobs`` builds at a time); one line and exit 2 when
    nothing can run."""
    from softcapgrad.engines.forward import catalog
    from softcapgrad.engines.environments import environments

    known = catalog.engines()
    if install:
        _built(environments.build_all([known[n].environment for n in names], jobs, say=_say))
    claimed = [n for n in names if known[n].types is None or any(t in known[n].types for t in types)]
    if types and not claimed:
        claims = "; ".join(f"{n} converts {', '.join(known[n].types)}" for n in names)
        raise InputError(f"no engine asked for has the architecture {', '.join(types)} ({claims}): nothing to run")
    states = {}
    for name in names:
        env = known[name].environment
        if env in states:
            continue
        if explicit or install:
            states[env] = environments.ready(env, install, say=_say, engine=name)
        else:
            states[env] = environments.state(env)
            if states[env].state == "untrusted":
                raise InputError(environments.refusal(states[env], name))
    runnable = [(n, t) for n in names for t in types
                if states[known[n].environment].state == "installed" and (known[n].types is None or t in known[n].types)]
    if types and not runnable:
        absent = [n for n in claimed if states[known[n].environment].state != "installed"]
        raise InputError(f"no engine asked for can run {', '.join(types)}: {', '.join(absent)} not installed "
                         "(softcapgrad engines install NAME)")
    return states


def _built(outcomes: dict) -> None:
    """One line and exit 2 where a build failed or was refused: every such environment's reason."""
    failed = [str(v) for v in outcomes.values() if isinstance(v, Exception)]
    if failed:
        raise InputError("; ".join(failed))


def parity(
    directory: Annotated[Optional[Path], typer.Argument(parser=path_given, metavar="[directory]",
                                                        help="A local model directory (config.json, safetensors "
                                                             "weights; never downloaded).")] = None,
    model_type: Annotated[Optional[list[str]], typer.Option(
        "--model-type", help="A capped model type, built tiny, or gemma3_text+attention (repeatable; default gemma2, "
                              "caps 30 and 50; docs/engines.md lists them).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Config field KEY=VALUE (repeatable).")] = None,
    engine: Annotated[Optional[list[str]], typer.Option(
        "--engine", help="An engine (softcapgrad engines lists them), or all (repeatable; default all).")] = None,
    install: Annotated[bool, typer.Option("--install", help="Install the engines' environments first.")] = False,
    seq_len: Annotated[Optional[int], typer.Option(
        "--seq-len", callback=Bound(2, 512, "the tiny models' positions"),
        help="Tokens of the random input (2 to 512; default 16); with DIR, the most of the prompts' tokens kept "
             "(default all, up to 512).")] = None,
    bind: Annotated[bool, typer.Option(
        "--bind", help="With DIR: random token ids and the weights rescaled so that each cap binds (|a/c| 4), as "
                       "for the built models, instead of the folder as saved.")] = False,
    prompt: Annotated[Optional[list[str]], typer.Option(
        "--prompt", help="With DIR: a prompt, tokenized by the folder's tokenizer.json (repeatable; default: the "
                         "prompts shipped with softcapgrad).")] = None,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", parser=path_given, metavar="<path>", help="With DIR: a UTF-8 text file of prompts, one a "
                                                                "line.")] = None,
    seed: Annotated[Optional[int], typer.Option(callback=SEED, help="Seed of the weights and token ids (0 to 2^63 − 1; "
                                                                    "default 0).")] = None,
    timeout: Annotated[float, typer.Option(callback=Bound(1.0, 3600.0, "seconds each engine route may take"),
                                           help="Seconds each engine route may take, conversion included; with --server, "
                                                "each request (connecting, headers and body together); 1 to "
                                                "3600.")] = 300.0,
    jobs: Annotated[int, typer.Option(callback=Bound(1, 16, "each engine child holds a model and its engine"),
                                      help="Engine routes run at a time, and environments built at a time "
                                           "with --install (1 to 16; each engine child uses one thread).")] = 1,
    update: Annotated[bool, typer.Option(
        "--update", help="Replace only the engines measured now in --out's parity results; keep the rest.")] = False,
    out: Annotated[Optional[Path], typer.Option(parser=path_given, callback=out_folder, metavar="<path>",
                                                help="Folder for parity.json, parity.md and figures/parity.png "
                                                     "(default and 'none': nothing written).")] = None,
    server: Annotated[Optional[str], typer.Option(
        "--server", help="An OpenAI-compatible server (http://host:port) serving DIR's weights: check it instead "
                         "(answers read up to 8 MiB each, redirects not followed).")] = None,
    server_model: Annotated[Optional[str], typer.Option(
        "--server-model", help="The model name the server knows (default: the first it lists).")] = None,
    repro: Annotated[Optional[Path], typer.Option(
        "--repro", parser=path_given, metavar="<path>", help="A new (or empty) folder: a reproduction bundle for "
                                                              "every engine route with a finding.")] = None,
    python: Annotated[Optional[Path], typer.Option(
        "--python", parser=path_given, metavar="<path>", help="An interpreter of your own (your build of the engine) "
                                                               "to run the one --engine with.")] = None,
    json_out: Json = False,
    wide: Wide = False,
) -> None:
    """Do a model's soft-caps survive leaving transformers: the same weights through each engine, a verdict per cap."""

    def build() -> Report:
        import importlib.util

        if python is not None:  # every path is read before anything else; the probe runs it once the engine is known
            from softcapgrad.engines.forward import interpreter

            interpreter.runnable(python)
        if importlib.util.find_spec("transformers") is None:
            raise InputError("parity needs transformers: pip install 'softcapgrad[hf]'")
        import json

        from softcapgrad.core import progress
        from softcapgrad.core.files import check_targets, replace_all, writable_folder
        from softcapgrad.engines.environments.environments import FORMER
        from softcapgrad.engines.forward import catalog, folder, modeltypes, parity as run, parity_run, reference
        from softcapgrad.engines.forward import runner
        from softcapgrad.cli import parity_runs as extra
        from softcapgrad.engines.repro import report as repro_report
        from softcapgrad.models import audit

        if server is not None or server_model is not None:
            not_with({"--jobs": None if jobs == 1 else jobs, "--update": update or None, "--repro": repro,
                      "--python": python, "--bind": bind or None, "--prompt": prompt, "--prompts": prompts},
                     "with --server")
            return _served(directory, server, server_model, engine, model_type, install, out, set_, seq_len, seed,
                           timeout)
        known = catalog.engines()
        names = pick("--engine", engine, tuple(known), former=FORMER)
        explicit = bool(engine) and not any(e.strip().lower() == "all" for e in engine)
        if directory is not None:
            not_with({"--model-type": model_type}, "with a model directory")
        not_with({"--prompt": prompt, "--prompts": prompts} if directory is None or bind else {},
                 "without a model directory run as saved: the built models, and --bind, use random token ids")
        types = [] if directory is not None else list(dict.fromkeys(model_type or ["gemma2"]))
        for t in types:
            if t in dict(reference.NOT_YET):
                raise InputError(f"--model-type {t}: parity does not build it: {dict(reference.NOT_YET)[t]}")
            if t not in reference.SUPPORTED:
                raise InputError(f"--model-type {t}: parity runs {', '.join(reference.SUPPORTED)}")
        n, s, j = seq_len or extra.RANDOM_TOKENS, seed_in_range(seed), jobs
        if out is not None:
            writable_folder(out, "--out")
            check_targets([out / name for name in FILES], "--out")
            if not update:
                keep_fuller(out / FILES[0], {"engines": names, "model": [str(directory)] if directory else types},
                            "a partial run does not replace them (--update replaces only what it measures, or give "
                            "another --out)")
        earlier = extra.earlier(out) if update else None
        if repro is not None:
            repro_report.target(repro)
        sources, inputs = [], {}
        if directory is not None:
            texts = None if bind else folder.prompts_given(prompt, prompts)
            sources.append((str(directory), audit.source(directory, None, set_ or [])))
        for t in types:
            sources.append((t, audit.source(None, modeltypes.model_type(t), reference.tiny_sets(t) + (set_ or []))))
        for _, src in sources:
            reference.check(src.config)
        if directory is not None:
            inputs[str(directory)] = extra.folder_inputs(sources[0][1], texts, bind, seq_len, s, j)
            n = n if bind else int(inputs[str(directory)].ids.size)
        if earlier is not None:  # the folder's inputs read first: a folder's tokens count, and what they are
            then, how = earlier["params"], inputs[str(directory)].how if inputs else None
            differs = [k for k, v in (("seed", s), ("seq_len", n), ("set", set_ or []), ("inputs", how))
                       if then.get(k) != v]
            if differs:
                raise InputError(f"--update: the earlier results were measured with another {', '.join(differs)} "
                                 f"({', '.join(f'{k} {then.get(k)!r}' for k in differs)}): their references differ")
        kinds = [src.config.model_type for _, src in sources]
        facts, states = (extra.given_python(python, names, explicit, install, kinds) if python is not None
                         else (None, _plan(names, kinds, explicit, install, j)))
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        chosen = [known[name] for name in names]
        with extra.bundles(repro) as staged:
            try:
                total = sum(len(e.routes) for e in chosen) * len(sources)
                triples = [(label, src, None if staged is None else staged / ".work" / str(i))
                           for i, (label, src) in enumerate(sources)]
                with runner.terminations(), progress.task("parity: engines", total) as advance:
                    results = parity_run.measure_all(triples, chosen, states, n, s, timeout, advance, j,
                                                     **({"inputs": inputs} if inputs else {}))
            finally:
                torch.set_num_threads(threads)
            extra.note_interpreter(results, facts)
            bundled = extra.place(staged, repro, results, states, facts)
        params = {"model": str(directory) if directory else types, "set": set_ or [], "engines": names,
                  "seq_len": n, "seed": s, "timeout": timeout, "out": str(out) if out else None,
                  **({"python": facts["path"]} if facts else {}), **({"repro": str(repro)} if repro else {}),
                  **({"bind": bind, "inputs": inputs[str(directory)].how} if directory is not None else {})}
        written: list = []
        if out is not None:  # the set is staged whole (the figure too), then put in place together
            from softcapgrad.engines.forward.figure import parity_figure

            data = {"params": params, **run.as_dict(results, extra.provenance(states, facts))}
            if update:
                data = run.merge(earlier, data)
                data["params"] = {**earlier["params"], "updated": earlier["params"].get("updated", []) + [params]}
            answer = answer_of(data)
            written = replace_all(result_set(out, {"parity.json": json.dumps({**data, "answer": list(answer)},
                                                                             indent=1, sort_keys=True) + "\n",
                                                   "parity.md": run.markdown(data, answer)},
                                             "figures/parity.png", lambda: parity_figure(data["rows"])), out)
        return parity_report(results, params, tuple(written), repro if repro is not None else None, bundled)

    emit(build, json_out, wide, command="parity")


def _served(directory, url, model, engine, model_type, install, out, sets, seq_len, seed, timeout) -> Report:
    """parity DIR --server URL: the user's deployment against the reference of DIR."""
    from softcapgrad.core.report import Table
    from softcapgrad.engines.forward import reference
    from softcapgrad.engines.served import server, serving
    from softcapgrad.models import audit

    if url is None:
        raise InputError("--server-model needs --server URL")
    server.base_url(url)
    not_with({"--engine": engine, "--model-type": model_type, "--install": install or None, "--out": out},
             "with --server")
    not_with({"--set": sets}, "with --server: the server runs DIR's config as it is, and the reference must too")
    if directory is None:
        raise InputError("--server needs the model directory DIR it serves: the server's weights are unknown here")
    from softcapgrad.cli.parity_runs import RANDOM_TOKENS

    n, s = seq_len or RANDOM_TOKENS, seed_in_range(seed)
    src = audit.source(directory, None, sets or [])
    reference.check(src.config)
    served = serving.check(src, url, model, n, s, timeout)
    params = {"model": str(directory), "server": served.url, "server_model": model,
              "seq_len": n, "seed": s, "timeout": timeout}
    return Report(command="parity", params=params,
                  tables=(Table("rows", f"verdict per cap on the server's top {served.judged['k']}", served.rows,
                                ("cap", "c", "verdict", "top_k", "max_logit", "error"),
                                wide=("error_off", "note")),),
                  notes=("error: largest |Δ log-prob| over the returned entries against the nearest reference that "
                         "keeps the cap; error off: against the nearest without it",),
                  ok=served.judged_any, exit_code=NO_VERDICT, answer=serving.answer(served))


engines_app = typer.Typer(add_completion=False, no_args_is_help=False)


def size_text(size: int) -> str:
    """Bytes on disk as the listing prints them: MiB below a GiB, GiB above, one decimal; "—" for nothing."""
    if not size:
        return "—"
    return f"{size / 2 ** 30:.1f} GiB" if size >= 2 ** 30 else f"{size / 2 ** 20:.1f} MiB"


def _training_only() -> dict:
    """Each environment only train-parity uses -> the train-parity engines that use it."""
    from softcapgrad.engines.forward import catalog
    from softcapgrad.engines.training import routes

    forward = set(catalog.environments())
    only: dict = {}
    for name, env in routes.ENGINES.items():
        if env not in forward:
            only.setdefault(env, []).append(name)
    return only


def _listing() -> Report:
    from softcapgrad.core.report import Table
    from softcapgrad.engines.environments import environments
    from softcapgrad.engines.forward import catalog
    from softcapgrad.engines.training import routes

    environments.sweep(say=_say)
    only = _training_only()
    states = {env: environments.state(env) for env in [*catalog.environments(), *only]}
    trained = {(name, env) for name, env in routes.ENGINES.items()}

    def row(engine: str, env: str, check: str, route_ids, packages) -> dict:
        st = states[env]
        shown = {k: v for k, v in st.versions.items() if k.lower() in _MAIN_PACKAGES + packages}
        said = f"untrusted: {st.reason}" if st.state == "untrusted" else st.state
        return {"engine": engine, "check": check, "environment": env, "state": said,
                "size": size_text(st.size), "size_bytes": st.size or None, "routes": ", ".join(route_ids),
                "versions": ", ".join(f"{k} {v}" for k, v in (shown or st.versions).items()),
                "reason": st.reason, "path": str(st.path) if st.path else "softcapgrad's own"}

    rows = [row(e.name, e.environment, "both" if (e.name, e.environment) in trained else "parity",
                [r.id for r in e.routes], (e.name, e.adapter)) for e in catalog.engines().values()]
    rows += [row(", ".join(names), env, "train-parity", [r.id for n in names for r in routes.routes(n)],
                 tuple(p for n in names for p in routes.LIBRARIES.get(n, ()))) for env, names in only.items()]
    parity_rows = [r for r in rows if r["check"] != "train-parity"]  # "parity" or "both"
    ready = [r["engine"] for r in parity_rows if r["state"] == "installed"]
    built = [r["environment"] for r in rows if r["check"] == "train-parity" and r["state"] == "installed"]
    suspects = sorted({str(st.suspect) for st in states.values() if st.state == "untrusted"})
    answer = (f"{len(ready)} of {len(parity_rows)} engines can run now: {', '.join(ready) or 'none'}.",
              f"{len(built)} of {len(only)} environments of train-parity's own are installed"
              f"{': ' + ', '.join(built) if built else ''}.",
              "softcapgrad engines install NAME builds an engine's environment (once; reused after).")
    if suspects:
        answer += (f"Untrusted, never run (someone else may have put or changed them): remove "
                   f"{', '.join(suspects)} (rm -rf), then install again.",)
    return Report(command="engines", params={"cache": str(environments.cache_root())},
                  tables=(Table("rows", "engines and their environments", rows,
                                ("engine", "check", "environment", "state", "size", "routes"),
                                wide=("versions", "reason", "path")),),
                  answer=answer)


_MAIN_PACKAGES = ("torch", "transformers", "onnxruntime", "keras-hub", "jax", "llama-cpp-python", "vllm")


@engines_app.callback(invoke_without_command=True)
def engines_list(ctx: typer.Context, json_out: Json = False, wide: Wide = False) -> None:
    """Every environment parity and train-parity run in, by engine: its state, versions and size on disk."""
    if ctx.invoked_subcommand is None:
        emit(_listing, json_out, wide, command="engines")


def _known() -> dict:
    """Every name install and remove take -> its environment: parity's engines, then train-parity's engines whose
    environment is train-parity's own, then every environment by its own name (train-peft, main)."""
    from softcapgrad.engines.environments import environments
    from softcapgrad.engines.forward import catalog

    known = {name: e.environment for name, e in catalog.engines().items()}
    for env, names in _training_only().items():
        known.update({n: env for n in names if n not in known})
    known.update({env: env for env in [environments.MAIN, *environments.names()] if env not in known})
    return known


def _picked(names: list[str]) -> list[str]:
    from softcapgrad.engines.environments.environments import FORMER

    known = _known()
    return list(dict.fromkeys(known[n] for n in pick("engine", names, tuple(known), former=FORMER)))


def _manage(envs: list[str], act) -> Report:
    from softcapgrad.core.report import Table

    rows = [act(env) for env in envs]
    return Report(command="engines", params={"environments": envs}, tables=(Table("rows", "environments", rows),),
                  answer=(" ".join(r["done"] for r in rows),))


@engines_app.command("install")
def engines_install(names: Annotated[list[str], typer.Argument(help="Engines or environments (or all).")],
                    json_out: Json = False) -> None:
    """Build the environments of engines (parity's and train-parity's) or named environments (reused when already
    built; rebuilt when broken or stale), two at a time."""
    from softcapgrad.engines.environments import environments

    def build():
        envs = _picked(names)
        _built(environments.build_all(envs, environments.BUILDS_AT_ONCE, say=_say))
        return _manage(envs, act)

    def act(env):
        st = environments.state(env) if env != environments.MAIN else environments.main_state()
        return {"environment": env, "state": st.state, "size": size_text(st.size), "size_bytes": st.size or None,
                "done": f"{env}: {st.state} ({size_text(st.size)})."}

    emit(build, json_out, command="engines install")


@engines_app.command("remove")
def engines_remove(names: Annotated[list[str], typer.Argument(help="Engines or environments (or all).")],
                   json_out: Json = False) -> None:
    """Delete the environments of engines or named environments (every key of each: current and stale)."""
    from softcapgrad.engines.environments import environments

    def act(env):
        if env == environments.MAIN:
            return {"environment": env, "freed_mib": 0.0, "done": f"{env}: softcapgrad's own, kept."}
        freed = environments.remove(env)
        return {"environment": env, "freed_mib": round(freed / 2 ** 20, 1),
                "done": f"{env}: removed ({freed / 2 ** 20:.0f} MiB freed)." if freed else f"{env}: was not installed."}

    emit(lambda: _manage(_picked(names), act), json_out, command="engines remove")
