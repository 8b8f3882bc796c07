"""Probes: each reads one honest signal on the node and reports a state."""
