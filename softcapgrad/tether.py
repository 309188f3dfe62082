"""``softcapgrad.tether``: TetherGate's public names at their first address (now softcapgrad.training.tether)."""

from softcapgrad.training.tether import (  # noqa: F401
    FloorSchedule,
    TetherGate,
    anchor_targets,
    floor_schedule,
    tethergate_step,
    tethergate_step_per_gate,
)

__all__ = ["FloorSchedule", "TetherGate", "anchor_targets", "floor_schedule", "tethergate_step",
           "tethergate_step_per_gate"]
