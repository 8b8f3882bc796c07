"""Two controllers and the lease that lets one of them act (docs/design.md, "Controller pair")."""
