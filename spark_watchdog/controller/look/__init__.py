"""What the controller sees of each node and how it judges it: the monitor, the
node's record, the intake of agents' answers, the peers' evidence
(docs/architecture.md, "Deciding and carrying out")."""
