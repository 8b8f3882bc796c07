"""The faults this project is tried against, by one name each, in the lab and
in the simulation (docs/simulation.md, "Fault menu"; the README lists the lab's).

The lab plays a fault on real processes (``spark-watchdog lab inject NAME``,
or a scenario of that name: lab/faults.py, lab/stories/scenarios.py); the
simulation plays it on its world (simulation/run.py, simulation/pair.py).
Where both play a fault they use the name here, and mean the same thing by
it: what happens on a real cluster, written below. A test checks that each
side names only faults of this menu, and every fault the menu gives a side.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    name: str
    what: str  # as it happens on a real cluster
    lab: bool = False  # the lab plays it (lab inject, or a scenario of this name)
    simulation: bool = False  # the simulation plays it (random, or scripted)


def _both(name: str, what: str) -> Fault:
    return Fault(name, what, lab=True, simulation=True)


def _lab(name: str, what: str) -> Fault:
    return Fault(name, what, lab=True)


def _sim(name: str, what: str) -> Fault:
    return Fault(name, what, simulation=True)


_MENU = (
    # A node's host
    _both("freeze", "the whole host freezes silently: no agent, no SSH banner, no kernel log"),
    _both("thaw", "a frozen host comes back by itself"),
    _both("double-freeze", "two hosts freeze at once"),
    _sim("freeze-thaw", "a host freezes for 1-40 s, then comes back by itself"),
    _both("reboot", "a planned reboot: orderly shutdown, SSH refused a while, a new boot"),
    _sim("reboot-hang", "a planned reboot that hangs after its shutdown"),
    _sim("ssh-bug", "the next reboot or halt over SSH fails unexpectedly"),
    _both("mem-collapse", "the host's available memory collapses; the memory guard kills the rank"),
    _both("gpu-hang", "the GPU driver wedges: NVML reads block while the host answers"),
    _both(
        "xid", "a GPU fault (an Xid): 13, 31 and 43 end the rank's CUDA context, the agent stops it"
    ),
    _lab("xid-freeze", "an Xid the journal never sees, then the host freezes 3 s later"),
    _sim("xid-31", "a GPU memory page fault (Xid 31) ends the rank's CUDA context"),
    _sim("xid-79", "an Xid the table does not name: evidence only"),
    _both("clock-latch", "the GPU clock latches low under load and survives reboots"),
    # The agent
    _sim("agent-crash", "the agent exits and is restarted (new start, seq from 0)"),
    _both("stuck-agent", "the agent's loop wedges: it answers with a seq that never moves"),
    _sim("slow-agent", "the agent answers near its timeout"),
    # Serving
    _lab("wedge", "the head's engine stops stepping while requests run; /health stays 200"),
    _lab("idle-wedge", "the head's engine hangs while idle: new requests wait"),
    _lab("crash", "the head's /health answers 503 (the engine is dead)"),
    _lab("crash-exit", "the head's vLLM rank exits with code 0"),
    _sim("serving-start-fails", "a node's next serving start: its rank exits at once"),
    _sim("serving-stop-hangs", "a node's next serving stop is never answered"),
    _sim("serving-wrong-profile", "the next start brings the head up less safe than asked"),
    # The network
    _both("partition", "nodes' links go dark, management and fabric: connections time out"),
    _both("mgmt-partition", "nodes' management links go dark; the fabric between them stays up"),
    _both("fabric-partition", "nodes' fabric links go dark; the management network stays up"),
    _sim("mgmt-partition-90", "a node's management link dark for 90 s, its fabric up"),
    _sim("fabric-partition-90", "a node's fabric link dark for 90 s, its management link up"),
    _sim(
        "mgmt-partition-others-15",
        "every other node's management link dark for 15 s, the fabric up: a switch's blip",
    ),
    _sim(
        "agent-restart-mgmt-partition",
        "a node's agent restarts on the same boot (its seq from 0, a new run), then its "
        "management link goes dark for 20-120 s, the fabric up",
    ),
    _sim("pulse-replay", "a node's old pulses, of any boot or run, replayed from its address"),
    _sim(
        "pulse-forged",
        "pulses forged from a node's address: its seq far ahead, made-up runs, a 31-digit seq",
    ),
    _sim(
        "mgmt-partition-blip-others",
        "a node's management link dark for 30-120 s and, meanwhile, every other node's for a "
        "blip of 3-20 s, the fabric up",
    ),
    _sim("partition-3x60", "three of four nodes cut off for 60 s"),
    _sim("partition-3x10", "three of four nodes cut off for 10 s"),
    _sim("packet-loss", "5-90 % of a node's packets are lost"),
    _sim("dns-failure", "a node's name stops resolving"),
    _sim("controller-net-down", "the controller host's own network goes down"),
    _sim("witness-down", "the witness the controller checks its own network with is down"),
    # Power
    _both("pdu-down", "the PDU's management card stops answering"),
    _sim("pdu-slow", "the PDU answers slowly"),
    _sim("pdu-refusing", "the PDU refuses commands"),
    _sim("pdu-ambiguous", "a command's answer never comes; it did or did not land"),
    _sim("pdu-lag", "the PDU's read-back lags the outlet"),
    _sim("pdu-bug", "the PDU driver fails unexpectedly"),
    _both("outlet-off", "a person switches a node's outlet off at the PDU"),
    _sim("outlet-on", "a person switches a node's outlet on at the PDU"),
    # The controller and its history
    _both("controller-kill", "the controller is killed (SIGKILL) and started again"),
    _sim("history-locked", "the history is locked by another writer for a while"),
    _sim("history-full", "the history's disk is full for a while"),
    _sim("history-full-60", "the history's disk is full for 60 s"),
    _sim("clock-step", "the controller host's wall clock steps by 10 minutes"),
    _sim("hold", "an operator holds a node or the cluster, and releases it later"),
    # A controller pair
    _sim("leader-pause", "the leading controller stops (SIGSTOP, a stalled VM) and wakes later"),
    _sim("leader-pause-40", "the leading controller stops for 40 s"),
    _sim("leader-kill", "the leading controller is killed and started again as a standby"),
    _sim("leader-cut", "the leading controller's link to the history goes dark for a while"),
    _sim("leader-cut-30", "the leading controller's link to the history is dark for 30 s"),
    # Controllers on the Sparks themselves (each dies with its host)
    _sim("freeze-head", "the serving head's host freezes, and its controller with it"),
    _sim("freeze-first-controller", "the host of the first controller in the order freezes"),
    _sim("freeze-controller-host", "a host that runs a controller freezes, and the controller"),
    _sim("fabric-cable-pulled", "the fabric cable between two Sparks is pulled for a while"),
    _sim("switch-down", "the management switch is gone for a while: no host reaches another"),
    _sim("plug-unreachable", "the plug cannot be reached from one controller's host for a while"),
    _sim("controller-pause", "a controller on a Spark stops (SIGSTOP) and wakes later"),
    _sim("controller-pause-40", "a controller on a Spark stops for 40 s"),
    _sim(
        "partition-heals-mid-cycle",
        "a node's links go dark for about as long as finding it silent and cutting it take",
    ),
    _sim(
        "total-partition", "the switch gone and every fabric cable pulled: no path between Sparks"
    ),
    # The lab, its controllers inside its nodes (lab/stories/colocated_scenarios.py)
    _lab("colocated-head-freeze", "two Sparks, a controller on each: the head's host freezes"),
    _lab("colocated-freeze", "two Sparks, a controller on each: the other Spark freezes"),
    _lab("colocated-fabric-cut", "two Sparks, a controller on each: the fabric cable is pulled"),
    _lab("colocated-mgmt-cut", "two Sparks, a controller on each: one management link is cut"),
    _lab("colocated-partition", "two Sparks: the management switch gone and the cable pulled"),
    _lab("colocated-both-frozen", "four Sparks, controllers on two: both their hosts freeze"),
    _lab("colocated-both-frozen-all", "four Sparks, a controller on each: two of them freeze"),
)

MENU: dict[str, Fault] = {f.name: f for f in _MENU}
LAB = frozenset(f.name for f in _MENU if f.lab)
SIMULATION = frozenset(f.name for f in _MENU if f.simulation)
