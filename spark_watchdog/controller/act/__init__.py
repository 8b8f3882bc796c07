"""What carries out a decided step: the freeze, wedged and clock-latch ladders, power
actions, holds, agent restarts (docs/architecture.md, "Deciding and carrying out")."""
