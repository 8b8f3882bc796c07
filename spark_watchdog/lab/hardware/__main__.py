"""``python -m spark_watchdog.lab.hardware DEVICE [ARGS...]``: run one simulated
device as a process of its own; ``DEVICE --help`` for its arguments.

One entry point for every stand-in the lab (and a person) starts: the PDU,
a smart plug, vLLM, a whole simulated host, the host's forced SSH command,
and the lookup of the real vLLM build.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def _pdu(argv: list[str]) -> int:
    from spark_watchdog.lab.hardware.pdu_standin import main

    return main(argv)


def _plug(argv: list[str]) -> int:
    from spark_watchdog.lab.hardware.plug_standin import main

    return main(argv)


def _vllm(argv: list[str]) -> int:
    from spark_watchdog.lab.hardware.vllm_standin import main

    return main(argv)


def _host(argv: list[str]) -> int:
    from spark_watchdog.lab.hardware.sim_host import main

    return main(argv)


def _ssh_command(argv: list[str]) -> int:
    from spark_watchdog.lab.hardware.lab_sshd import main

    return main(argv)


def _launch_cluster(argv: list[str]) -> int:
    from spark_watchdog.lab.hardware.launch_cluster import main

    return main(argv)


def _real_vllm(argv: list[str]) -> int:
    from spark_watchdog.lab.hardware.real_vllm import main

    return main(argv)


def _tcp_proxy(argv: list[str]) -> int:
    from spark_watchdog.lab.hardware.tcp_proxy import main

    return main(argv)


# Each device imports its module only when it runs (pysnmp for the PDU alone).
DEVICES: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "pdu": (_pdu, "a switched PDU on loopback SNMP"),
    "plug": (_plug, "a Shelly (Gen2+ or Gen1) or Tasmota smart plug on loopback HTTP"),
    "vllm": (_vllm, "a vLLM server stand-in (the lab's rank)"),
    "host": (_host, "one simulated Spark host: its agent, sshd and journal"),
    "ssh-command": (_ssh_command, "the lab host's forced SSH command"),
    "launch-cluster": (_launch_cluster, "the lab's cluster launcher (launch-cluster.sh's part)"),
    "real-vllm": (_real_vllm, "where the real vLLM CPU build is, or why not"),
    "tcp-proxy": (_tcp_proxy, "a TCP relay on loopback whose link a test can fail"),
}


def usage() -> str:
    width = max(map(len, DEVICES))
    lines = [f"  {name:<{width}}  {what}" for name, (_, what) in DEVICES.items()]
    return "usage: python -m spark_watchdog.lab.hardware DEVICE [ARGS...]\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    device = DEVICES.get(args[0])
    if device is None:
        print(f"no such device: {args[0]!r}\n{usage()}", file=sys.stderr)
        return 2
    return device[0](args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
