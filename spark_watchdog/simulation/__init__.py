"""A deterministic simulation of the real controller (docs/simulation.md).

The controller's clock and I/O are seams (controller/io.py); here they are
wired to simulated nodes, SSH banners, a witness, PDUs and a history with
faults, on an event loop whose time is virtual: a seed replays a run
exactly, and hours of cluster life take seconds. Invariants are checked at
every power command and at the end of each run.
"""
