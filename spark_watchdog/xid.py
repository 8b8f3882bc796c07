"""NVIDIA Xid errors: which ones mean the faulting process's CUDA context is gone.

The driver reports an Xid (a numbered GPU error) in the kernel log and, to a
process waiting on NVML's event set, as a critical error event
(docs/facts.md, "Xid events"). Most Xids are evidence only. The ones below
end the CUDA context of the process that caused them: that process (the
vLLM rank) cannot go on, so the agent stops it at once and the controller
restarts serving with the safe profile, as after a memory guard kill
(docs/design.md, "Live GPU faults"). An Xid not in this table is never acted
on, whatever its number.
"""

from __future__ import annotations

# Xid -> what NVIDIA's Xid catalog calls it.
CONTEXT_LOST: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault (MMU fault)",
    43: "GPU stopped processing (the channel was reset)",
}


def describe(xid: int) -> str:
    """``Xid 31 (GPU memory page fault (MMU fault))``, or ``Xid 79`` for one not in the table."""
    name = CONTEXT_LOST.get(xid)
    return f"Xid {xid}" if name is None else f"Xid {xid} ({name})"


def ends_the_context(xid: object) -> bool:
    """The fault ends the faulting process's CUDA context (an int in the table)."""
    return isinstance(xid, int) and not isinstance(xid, bool) and xid in CONTEXT_LOST
