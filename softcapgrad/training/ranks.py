"""The monitor's counts summed over the ranks of a torch.distributed process group.

Every rank calls ``all_reduce()`` once, at report time. The ranks first meet through the group's
store (each sets a key, then waits for the others' within a short timeout), so a rank that never
calls is named in one line instead of leaving the others in a collective until the process
group's own timeout (30 minutes for gloo); then one ``all_gather_object`` carries each rank's sums.
"""

from __future__ import annotations

from dataclasses import astuple

from softcapgrad.training.tally import _merge, _Tally

_CALLS: dict[tuple, int] = {}  # process group's ranks -> all_reduce() calls made here, a generation for its keys


def _all_ranks_here(group, timeout: float) -> None:
    """Wait, through the process group's store, until every rank of ``group`` has called all_reduce() as many
    times as this one; name the ranks missing after ``timeout`` seconds."""
    import datetime

    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_group, _get_process_group_store

    store = _get_process_group_store(group or _get_default_group())
    ranks = dist.get_process_group_ranks(group or _get_default_group())
    generation = _CALLS[tuple(ranks)] = _CALLS.get(tuple(ranks), 0) + 1
    keys = [f"softcapgrad/all_reduce/{generation}/{r}" for r in range(len(ranks))]
    store.set(keys[dist.get_rank(group)], "here")
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout))
    except Exception as err:  # the store's timeout error
        try:
            missing = [ranks[r] for r, key in enumerate(keys) if not store.check([key])]
        except Exception:  # the store itself is gone (the rank that held it left)
            missing = []
        raise RuntimeError(
            f"all_reduce(): rank{'s' if len(missing) != 1 else ''} {', '.join(map(str, missing)) or '?'} did not call "
            f"it within {timeout:g} s (call number {generation} on rank {dist.get_rank()}): every rank of the "
            "group must call it, once per monitor, at the same point") from err


def sum_over_ranks(local: dict, group, timeout: float) -> dict[tuple, _Tally]:
    """``{site: (model qualifier, totals)}`` of this rank -> ``{(qualified module, *the site's other fields): tally}``
    summed over the group, the same on every rank and in the same order."""
    import torch.distributed as dist

    _all_ranks_here(group, timeout)
    mine: dict[tuple, list] = {}
    for site, (qualifier, totals) in local.items():
        key = (f"{qualifier}/{site.module}" if qualifier else site.module, *astuple(site)[2:])
        mine[key] = _merge(mine[key], totals) if key in mine else totals
    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    merged: dict[tuple, list] = {}
    for part in gathered:
        for key, totals in part.items():
            merged[key] = _merge(merged[key], totals) if key in merged else totals
    out = {}
    for key, totals in sorted(merged.items(), key=lambda kv: repr(kv[0])):
        tally = _Tally()
        for name, value in zip(_Tally.__slots__, totals):
            setattr(tally, name, value)
        out[key] = tally
    return out
