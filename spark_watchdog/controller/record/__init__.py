"""What the controller keeps and tells: the history's door, incidents, budgets, tallies
and alerts (docs/design.md, "Freeze history")."""
