"""The lab's simulated hardware, each piece on its own: a switched PDU and smart
plugs that speak their real protocols on loopback, a host (a process tree an
outlet powers), its journal, its sshd, its GPU (an NVML stand-in), and its
vLLM (a stand-in, or the real CPU server). Nothing here knows of a cluster."""
