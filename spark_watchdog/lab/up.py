"""``spark-watchdog lab up`` and ``spark-watchdog lab inject FAULT [NODE]``.

``lab up`` starts a lab (the cluster, the PDU, the real controller as
``spark-watchdog controller --config FILE``) and keeps it running until
Ctrl-C or SIGTERM, narrating what the controller does. With ``--colocated``
no controller runs on the lab machine: the nodes of the order run theirs,
``spark-watchdog controller --config FILE --node NAME``, each inside its own
host (lab/colocated.py), in network namespaces. It serves a small control
endpoint on loopback:

- ``GET /v1/lab``: the lab's nodes, URLs and paths (no token needed);
- ``POST /v1/inject`` with ``{"fault": "freeze", "node": "spark-3"}``:
  inject a fault (``Authorization: Bearer <token>``).

Where to find it is written to a pointer file readable only by its owner
(``$XDG_RUNTIME_DIR/spark-watchdog-lab.json``, else
``/tmp/spark-watchdog-lab-<uid>.json``): the control URL and its token.
``lab inject`` reads that file; ``--control URL --token-file FILE`` point it
elsewhere. The pointer file is removed when the lab stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

from spark_watchdog.agent.auth import BearerAuth
from spark_watchdog.config.secrets import Secret
from spark_watchdog.http.server import HttpEndpoint, Response, json_response
from spark_watchdog.lab.cluster import FAULTS, LabCluster, lab_processes
from spark_watchdog.lab.colocated_session import ColocatedLab
from spark_watchdog.lab.lab_controller import ControllerProcess
from spark_watchdog.lab.session import LabSession, signals_ignored
from spark_watchdog.lab.timeline import Narrator

# Faults the control endpoint takes besides the cluster's own.
CONTROL_FAULTS = {
    **FAULTS,
    "controller-kill": "SIGKILL the controller, then start it again (it resumes from its history); "
    "with --colocated, the named node's controller, started again 5 s later as by its unit",
}


def pointer_path() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "spark-watchdog-lab.json"
    return Path(tempfile.gettempdir()) / f"spark-watchdog-lab-{os.getuid()}.json"


class LabControl:
    """The control endpoint of a running ``lab up``."""

    def __init__(self, session: LabSession | ColocatedLab) -> None:
        self.session = session
        self.token = secrets.token_urlsafe(24)
        self._lock = threading.Lock()  # one injection at a time
        auth = BearerAuth(Secret(self.token, "lab control token"))
        self.endpoint = HttpEndpoint(
            "127.0.0.1",
            0,
            {"/v1/lab": self._describe},
            {"/v1/inject": self._inject},
            authorize=auth.check,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.endpoint.port}"

    def start(self) -> LabControl:
        self.endpoint.start()
        return self

    def stop(self) -> None:
        self.endpoint.stop()

    def describe(self) -> dict[str, Any]:
        session = self.session
        lab = session.lab
        assert lab.pdu is not None
        described: dict[str, Any] = {
            "control": self.url,
            "pid": os.getpid(),
            "directory": str(session.workdir),
            "pdu": {
                "snmp": f"udp://{lab.pdu.standin.host}:{lab.pdu.port}",
                "vendor": lab.vendor,
            },
        }
        if isinstance(session, ColocatedLab):
            described["config"] = str(session.config_path)
            described["controllers"] = [
                {"node": p.name, "url": p.url, "history": str(p.history), "log": str(p.log)}
                for p in session.placed.values()
            ]
        else:
            assert session.controller is not None
            described["history"] = str(session.history_path)
            described["controller"] = {
                "url": session.controller.url,
                "config": str(session.config_path),
            }
        described["nodes"] = _nodes(lab)
        described["faults"] = CONTROL_FAULTS
        return described

    def _describe(self) -> Response:
        return json_response(self.describe())

    def _inject(self, body: dict[str, Any]) -> Response:
        fault = body.get("fault")
        name = body.get("node")
        if fault not in CONTROL_FAULTS:
            known = ", ".join(CONTROL_FAULTS)
            return json_response({"error": f"unknown fault {fault!r}; known: {known}"}, 400)
        lab = self.session.lab
        node = None
        if name is not None:
            node = next((n for n in lab.nodes if n.name == name), None)
            if node is None:
                names = ", ".join(n.name for n in lab.nodes)
                return json_response({"error": f"no node {name!r}; nodes: {names}"}, 400)
        with self._lock:
            try:
                what = self._apply(str(fault), node)
            except ValueError as exc:
                return json_response({"error": str(exc)}, 400)
        self.session.say(f"FAULT {fault}: {what}")
        return json_response({"injected": fault, "node": name, "what": what})

    def _apply(self, fault: str, node: Any) -> str:
        if fault != "controller-kill":
            return self.session.lab.inject(fault, node)
        if isinstance(self.session, ColocatedLab):
            return _kill_on_node(self.session, node)
        controller = self.session.controller
        if not isinstance(controller, ControllerProcess):
            raise ValueError("the controller does not run as a process here")
        old = controller.pid
        controller.kill()
        time.sleep(1.0)
        controller.start()
        return f"controller pid {old} SIGKILLed; started again as pid {controller.pid}"


def _nodes(lab: LabCluster) -> list[dict[str, Any]]:
    return [
        {
            "name": n.name,
            "agent": n.agent_url,
            "vllm": n.vllm_url if n.head else None,
            "ssh": f"{n.address}:{n.ssh_port}",
            "outlet": n.outlet,
            "directory": str(n.directory),
        }
        for n in lab.nodes
    ]


def _session(
    workdir: Path, nodes: int, netns: bool, serving: str, controllers: tuple[str, ...] | None
) -> LabSession | ColocatedLab:
    narrator = Narrator()
    if controllers is not None:
        return ColocatedLab(workdir, nodes=nodes, controllers=controllers, narrator=narrator)
    return LabSession(
        workdir,
        nodes=nodes,
        narrator=narrator,
        controller_mode="process",
        netns=netns,
        serving=serving,
    )


def _kill_on_node(session: ColocatedLab, node: Any) -> str:
    """SIGKILL the controller a node runs; its host starts it again, as its unit would."""
    placed = session.placed.get(node.name) if node is not None else None
    if placed is None:
        raise ValueError(f"name a node that runs a controller ({', '.join(session.placed)})")
    process = placed.process(session.lab.tree(placed.node))
    if process is None:
        raise ValueError(f"no controller runs on {placed.name} now")
    process.kill()
    return f"{placed.name}'s controller (pid {process.pid}) SIGKILLed; its host starts it in 5 s"


def run_up(
    workdir: Path,
    nodes: int,
    *,
    netns: bool = False,
    serving: str = "process",
    controllers: tuple[str, ...] | None = None,
) -> int:
    """``controllers``: the nodes that run one, in order (--colocated); None: the
    controller runs on the lab machine."""
    session = _session(workdir, nodes, netns, serving, controllers)
    pointer = pointer_path()
    control: LabControl | None = None
    try:
        session.start()
        control = LabControl(session).start()
        pointer.touch(mode=0o600)
        pointer.chmod(0o600)
        pointer.write_text(json.dumps({"control": control.url, "token": control.token}) + "\n")
        for line in _banner(control.describe(), pointer):
            print(line, flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("\nstopping the lab ...", flush=True)
        return 0
    finally:
        with signals_ignored():
            if control is not None:
                control.stop()
            with contextlib.suppress(OSError):
                if control is not None and control.token in pointer.read_text():
                    pointer.unlink()
            session.stop()
            left = lab_processes(session.lab.lab_id) if session.cluster is not None else []
            print(
                f"lab stopped; lab directory {workdir}"
                + (
                    f"; STILL RUNNING: pids {[p.pid for p in left]}"
                    if left
                    else "; no process left"
                )
            )


def _banner(info: dict[str, Any], pointer: Path) -> list[str]:
    lines = ["", "lab up: running until Ctrl-C"]
    if "controllers" in info:
        lines.append(f"  config      {info['config']} (one for every controller)")
        for placed in info["controllers"]:
            lines += [
                f"  controller  {placed['url']}/v1/status  (on {placed['node']})",
                f"              spark-watchdog history --db {placed['history']}",
            ]
    else:
        lines += [
            f"  controller  {info['controller']['url']}/v1/status  "
            f"(config {info['controller']['config']})",
            f"  history     {info['history']}",
            f"              spark-watchdog history --db {info['history']}",
        ]
    lines.append(f"  PDU         {info['pdu']['snmp']} ({info['pdu']['vendor']})")
    for node in info["nodes"]:
        vllm = f"  vllm {node['vllm']}" if node["vllm"] else ""
        lines.append(
            f"  {node['name']:<11} agent {node['agent']}/v1/state  ssh {node['ssh']}  "
            f"outlet {node['outlet']}{vllm}"
        )
    lines += [
        f"  control     {info['control']} (token in {pointer})",
        "  inject      spark-watchdog lab inject freeze spark-3   (faults: "
        + ", ".join(info["faults"])
        + ")",
        "",
    ]
    return lines


class InjectError(Exception):
    """The lab could not be reached or refused the injection (message for people)."""


def inject(
    fault: str, node: str | None, *, control: str | None = None, token: str | None = None
) -> dict[str, Any]:
    if control is None or token is None:
        pointer = pointer_path()
        try:
            found = json.loads(pointer.read_text())
        except (OSError, ValueError) as exc:
            raise InjectError(
                f"no running lab found ({pointer}: {exc}); start one with `spark-watchdog lab up`"
            ) from None
        control = control or str(found["control"])
        token = token or str(found["token"])
    try:
        answer = requests.post(
            f"{control.rstrip('/')}/v1/inject",
            json={"fault": fault, "node": node},
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )
    except requests.RequestException as exc:
        raise InjectError(f"the lab at {control} did not answer: {exc}") from None
    try:
        body = answer.json()
    except ValueError:
        body = {"error": answer.text[:200]}
    if answer.status_code != 200:
        raise InjectError(str(body.get("error") or f"HTTP {answer.status_code}"))
    return body if isinstance(body, dict) else {}
