"""Serving across the cluster: its policy, its budget, restarts through the agents or a
launcher (docs/serving.md)."""
