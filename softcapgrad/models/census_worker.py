"""One census worker: ``python -P -s -m softcapgrad.models.census_worker`` (started by softcapgrad.core.child).

It reads one JSON object on stdin (``model_types``, ``implementations``, ``seconds``) and writes each model
type's row on stdout as one line of JSON as soon as it is done, so the caller's progress moves with it.
Nothing but JSON crosses: a row is plain data.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict


def main() -> None:
    import torch

    from softcapgrad.models import census

    asked = json.loads(sys.stdin.read())
    known = {c.model_type: c for c in census.candidates()}
    torch.set_num_threads(1)
    with census.address_space(census.HEADROOM):
        for model_type in asked["model_types"]:
            row = census.census_row(known[model_type], tuple(asked["implementations"]), asked["seconds"])
            sys.stdout.write(json.dumps(asdict(row), sort_keys=True) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
