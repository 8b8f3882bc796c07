"""The node agent: runs the probes, serves the snapshot, talks to systemd."""
