"""Whose an object with a run's name is: the run's own, or another's that the run must not take.

The controller names what it makes for a run after the run (its NetworkPolicy, its checkpoint key).
Such a name can already be taken: by the run itself (the controller stopped between making it and
the RayJob, or an earlier attempt made it), by a deleted run of the same name whose objects the
garbage collector has not removed yet, or by something a person made. Only the first is the run's.
"""

from __future__ import annotations

from spotray.contract.spec import TrainingRun


def foreign_object_refusal(kind: str, name: str, run: TrainingRun, run_uid: str, owner_uids: list[str]) -> str | None:
    """Why the existing ``kind`` ``name`` is not the run's (a message naming the fix), or None when it is."""
    if run_uid in owner_uids:
        return None
    whose = "owned by another object" if owner_uids else "made by someone else"
    return (
        f"{kind} {run.namespace}/{name} exists and is not this run's ({whose}). If an earlier run of this name "
        f"was just deleted, this clears once the garbage collector removes it; otherwise delete or rename it "
        f"(kubectl -n {run.namespace} delete {kind.lower()} {name})"
    )
