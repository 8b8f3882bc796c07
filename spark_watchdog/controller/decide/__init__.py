"""Whether anything happens to a node now: pure functions of read-only views, no I/O and
no clock of their own (docs/architecture.md, "Deciding and carrying out")."""
