"""The lab: simulated Spark nodes, vLLM and power devices on one machine.

Three layers, each importing only the ones before it:

- ``hardware``: each simulated device on its own (PDU, plugs, host process,
  journal, sshd, GPU, vLLM);
- the cluster: ``cluster`` (nodes wired to a PDU), ``session`` (a cluster
  with its controller, alert receiver and timeline), ``lab_controller``,
  ``timeline`` (a session's narration), ``up`` (``lab up``), ``ports``;
- ``stories``: the demo, the scenarios and the agent demo.
"""
