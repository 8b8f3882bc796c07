"""One name for each fault, in the lab and in the simulation (spark_watchdog/fault_menu.py)."""

from __future__ import annotations

from spark_watchdog.fault_menu import LAB, MENU, SIMULATION
from spark_watchdog.lab.faults import FAULTS as LAB_INJECTS
from spark_watchdog.lab.stories.scenarios import SCENARIOS
from spark_watchdog.simulation.run import FAULT_PLAYS, FAULTS

# `lab inject heal` undoes the lab's faults: not a fault of its own.
NOT_FAULTS = {"heal"}


def test_the_lab_plays_exactly_the_menus_lab_faults() -> None:
    played = (set(LAB_INJECTS) - NOT_FAULTS) | set(SCENARIOS)
    assert played - set(MENU) == set(), "the lab names faults the menu does not have"
    assert played == LAB


def test_the_simulation_plays_exactly_the_menus_simulation_faults() -> None:
    assert set(FAULT_PLAYS) == SIMULATION
    assert set(FAULTS) <= SIMULATION  # the random ones


def test_names_are_one_style_and_every_fault_is_played_somewhere() -> None:
    for name, fault in MENU.items():
        assert name == name.lower() and "_" not in name and " " not in name, name
        assert fault.lab or fault.simulation, name
        assert fault.what, name
