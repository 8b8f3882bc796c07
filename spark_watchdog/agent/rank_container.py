"""The rank as a container of the local Docker Engine (``serving.runtime: docker``).

How Spark clusters run vLLM (docs/serving.md): in a container, privileged,
on the host's network. A ``docker run`` client as ``serving.command`` would
leave the container running when the client is killed, and the memory
guard's signal would reach the client only. So the agent drives the Engine
API itself, through the Docker SDK (no parsing of CLI output):

- One container per node (``serving.docker.name``), labelled with the node
  and the profile: start = remove the old one, create from
  ``serving.docker.image`` with ``serving.command`` (the profile merged, as
  for a process), host networking, restart policy ``no``, and start it;
  SIGTERM, SIGKILL and the memory guard's kill go through the API, which
  reaches a root process in a privileged container that no signal of the
  agent could.
- Its state comes from inspect and the daemon's event stream (a thread of
  its own, one inspect per event): nothing polls while nothing happens. A
  daemon that goes away leaves the state ``unknown`` (so nothing is called
  gone that was not seen gone) until it answers again.
- Its output (``docker logs --follow``) is appended to
  ``serving.log_file``, where the effective config is read as for a process.
- A container of exactly that name (or with every one of
  ``serving.docker.adopt_labels``; :func:`rank_match`, never an id prefix as
  ``docker inspect NAME`` would take) that the agent finds at its start, or
  that starts later while no rank of the agent's lives (the cluster's
  launcher brought it up: a ``start`` event), is adopted: watched, stopped
  and killed like its own; a start after it creates the rank anew from the
  config.
- With neither ``serving.command`` nor ``serving.docker.image`` configured,
  the rank is the launcher's container, and a start re-creates it from its
  own spec as inspect read it (image, command, environment, labels, host
  config), the profile merged into its command and the restart policy ``no``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import docker
import docker.errors
from docker.types import DeviceRequest

from spark_watchdog.agent.rank import LaunchFailed
from spark_watchdog.config.agent import ServingConfig
from spark_watchdog.probes.vllm import rank_process_alive

log = logging.getLogger("spark_watchdog.agent.rank_container")

LABEL_NODE = "spark-watchdog.node"
LABEL_PROFILE = "spark-watchdog.profile"
# On a container the agent re-created from the launcher's: the launcher's own
# entrypoint and command (JSON), which every later profile is merged into, so
# that no profile's flags stay behind for the next one (``plain`` gets the
# launcher's command back).
LABEL_BASE_COMMAND = "spark-watchdog.base-command"
# Docker's states in which processes of the container may live.
_LIVE = frozenset({"running", "restarting", "paused", "removing"})
_ENDED = frozenset({"exited", "dead"})
_RECONNECT_S = (1.0, 2.0, 5.0, 10.0)


class DockerUnavailable(LaunchFailed):
    """The Docker Engine cannot be asked (socket missing, refused, garbage)."""


def rank_match(
    name: str, adopt_labels: Mapping[str, str], names: Iterable[str], labels: Mapping[str, Any]
) -> Literal["name", "labels"] | None:
    """Whether a container (its ``names`` and ``labels``) is the rank's, and by
    what: its exact name (``serving.docker.name``), else every one of
    ``adopt_labels``. The one rule for a container listed or seen in the event
    stream; never an id prefix, which ``docker inspect NAME`` also takes (a
    hex-looking name would adopt, stop and kill another container;
    docs/serving.md, "Which container is the rank")."""
    if any(str(each).lstrip("/") == name for each in names):
        return "name"
    if adopt_labels and all(labels.get(key) == value for key, value in adopt_labels.items()):
        return "labels"
    return None


def engine_error(socket: str, exc: Exception) -> str:
    """What went wrong with the Engine API, with the fix where there is one."""
    text = str(exc).strip() or type(exc).__name__
    if not Path(socket).exists():
        return (
            f"serving.docker.socket {socket}: no such socket (is dockerd running? "
            "is this the socket it listens on?)"
        )
    if "Permission denied" in text:
        return (
            f"serving.docker.socket {socket}: permission denied; the agent needs the "
            "socket's group (the unit's docker drop-in, docs/serving.md)"
        )
    return f"Docker Engine at {socket}: {text[:300]}"


def finished_at(state: dict[str, Any]) -> float | None:
    """``State.FinishedAt`` as Unix seconds; None when absent, unreadable or
    Docker's zero time (the container never ended)."""
    text = state.get("FinishedAt")
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        unix = datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        return None
    return unix if unix > 0 else None


class ContainerState:
    """The container as the daemon last said, kept current by its events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.attrs: dict[str, Any] | None = None  # inspect's answer; None: no such container
        self.reachable = True
        self.error: str | None = None
        self.last_state: dict[str, Any] = {}

    def set(self, attrs: dict[str, Any] | None) -> None:
        with self._lock:
            if attrs is None and self.attrs is not None:
                # Removed: what it last said (its exit code) is all there is now.
                self.last_state = dict(self.attrs.get("State") or {})
            self.attrs, self.reachable, self.error = attrs, True, None

    def lost(self, error: str) -> None:
        with self._lock:
            self.reachable, self.error = False, error

    def status(self) -> str:
        """Docker's status, ``gone`` (no such container) or ``unknown`` (no daemon)."""
        with self._lock:
            if not self.reachable:
                return "unknown"
            if self.attrs is None:
                return "gone"
            return str(self.attrs.get("State", {}).get("Status", "unknown"))

    def state(self) -> dict[str, Any]:
        """Docker's State of the container, or the last one seen once it was removed."""
        with self._lock:
            if self.attrs is None:
                return dict(self.last_state)
            return dict(self.attrs.get("State", {}))

    def snapshot(self) -> tuple[dict[str, Any] | None, bool, str | None]:
        with self._lock:
            return self.attrs, self.reachable, self.error


class ContainerRank:
    """One container, watched through the daemon's events."""

    def __init__(
        self,
        runtime: ContainerRuntime,
        container_id: str,
        *,
        adopted: bool,
        log_file: Path,
        since: float,
    ) -> None:
        self.runtime = runtime
        self.id = container_id
        self.adopted = adopted
        self.log_file = log_file
        self.state = ContainerState()
        self._stop = threading.Event()
        self._log_since = since
        self._follower: threading.Thread | None = None
        self.state.set(runtime.inspect(container_id))
        self._watcher = threading.Thread(
            target=self._watch, name=f"docker-events-{container_id[:12]}", daemon=True
        )
        self._watcher.start()
        self._follow_logs()

    # -- the Rank protocol ---------------------------------------------------------

    @property
    def pid(self) -> int | None:
        if self.state.status() not in _LIVE:
            return None
        pid = self.state.state().get("Pid")
        return int(pid) if isinstance(pid, int) and pid > 0 else None

    def alive(self) -> bool:
        # Unknown (no daemon) counts as alive: nothing is called gone unseen.
        return self.state.status() in _LIVE | {"unknown"}

    def exit_code(self) -> int | None:
        status = self.state.status()
        if status in ("exited", "dead", "gone", "created"):
            state = self.state.state()
            code = state.get("ExitCode")
            if status == "gone" and state.get("Running"):
                code = None  # removed before its end was seen (a launcher's stop and rm)
            if not isinstance(code, int):
                # Never ran, or gone with its code unknown: ended all the same.
                return 0 if status in ("created", "gone") else None
            # 128 + n: the main process ended on signal n (docker kill, OOM).
            return -(code - 128) if 128 < code < 160 else code
        return None

    def ended_at(self) -> float | None:
        """Docker's own time of the end (``State.FinishedAt``, the ``die`` event's)."""
        return finished_at(self.state.state()) if self.exit_code() is not None else None

    def pids(self) -> list[int]:
        if self.state.status() not in _LIVE:
            return []
        try:
            top = self.runtime.client().api.top(self.id, ps_args="-eo pid")
        except docker.errors.NotFound:
            return []
        except (docker.errors.DockerException, OSError):
            pid = self.pid
            return [pid] if pid is not None else []
        return [int(row[0]) for row in top.get("Processes") or [] if row and row[0].isdigit()]

    def signal(self, signum: signal.Signals) -> None:
        try:
            self.runtime.client().api.kill(self.id, signal=signum.name)
        except docker.errors.NotFound:
            self.state.set(None)
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: not running, nothing to signal
                log.warning("serving: %s to container %s: %s", signum.name, self.id[:12], exc)
        except (docker.errors.DockerException, OSError) as exc:
            log.warning("serving: %s to container %s: %s", signum.name, self.id[:12], exc)

    def describe(self) -> dict[str, Any]:
        attrs, reachable, error = self.state.snapshot()
        state = (attrs or {}).get("State", {})
        config = (attrs or {}).get("Config", {})
        host = (attrs or {}).get("HostConfig", {})
        return {
            "container": {
                "id": self.id[:12],
                "name": str((attrs or {}).get("Name", "")).lstrip("/") or None,
                "image": config.get("Image"),
                "status": self.state.status(),
                "exit_code": state.get("ExitCode") if self.state.status() in _ENDED else None,
                "oom_killed": bool(state.get("OOMKilled")),
                "restart_policy": (host.get("RestartPolicy") or {}).get("Name") or "no",
                "adopted": self.adopted,
                "engine_reachable": reachable,
                "engine_error": error,
            }
        }

    def close(self) -> None:
        self._stop.set()

    # -- watching ----------------------------------------------------------------------

    def _watch(self) -> None:
        """Follow the daemon's events for this container; one inspect per event.
        Reconnects when the daemon goes away (and says so in the state)."""
        backoff = 0
        while not self._stop.is_set():
            try:
                client = self.runtime.new_client()
                events = client.api.events(
                    decode=True, filters={"type": "container", "container": self.id}
                )
                # Whatever happened while the stream was down.
                self.state.set(self.runtime.inspect(self.id, client))
                backoff = 0
                for event in events:
                    if self._stop.is_set():
                        break
                    self.state.set(self.runtime.inspect(self.id, client))
                    if event.get("status") in ("start", "restart"):
                        self._follow_logs()
                with contextlib.suppress(Exception):
                    events.close()
            except (docker.errors.DockerException, OSError, ValueError) as exc:
                self.state.lost(engine_error(self.runtime.socket, exc))
            if self._stop.wait(_RECONNECT_S[min(backoff, len(_RECONNECT_S) - 1)]):
                return
            backoff += 1

    def _follow_logs(self) -> None:
        if self._follower is not None and self._follower.is_alive():
            return
        self._follower = threading.Thread(
            target=self._copy_logs, name=f"docker-logs-{self.id[:12]}", daemon=True
        )
        self._follower.start()

    def _copy_logs(self) -> None:
        """``docker logs --follow`` from where it left off, appended to the serving log."""
        try:
            client = self.runtime.new_client()
            stream = client.api.logs(self.id, stream=True, follow=True, since=int(self._log_since))
            with self.log_file.open("ab") as sink:
                for chunk in stream:
                    sink.write(chunk)
                    sink.flush()
                    self._log_since = time.time()
                    if self._stop.is_set():
                        break
        except (docker.errors.DockerException, OSError, ValueError) as exc:
            log.debug("serving: the logs of container %s: %s", self.id[:12], exc)


class ContainerRuntime:
    """Creates the rank's container, and knows what an earlier rank left."""

    kind = "docker"

    def __init__(
        self, config: ServingConfig, process_match: str | None, node: str | None = None
    ) -> None:
        self.config = config
        self.docker = config.docker
        self.socket = config.docker.socket
        self.process_match = process_match
        self.node = node
        self._client: docker.DockerClient | None = None
        self._lock = threading.Lock()
        # The last container found to adopt, as inspect read it: what a start
        # re-creates when the config names no image and command of its own.
        self._spec: dict[str, Any] | None = None
        self._closed = threading.Event()

    def new_client(self) -> docker.DockerClient:
        """A client of its own (for a thread that streams)."""
        return docker.DockerClient(
            base_url=f"unix://{self.socket}",
            timeout=self.docker.api_timeout,
            version="auto",
        )

    def client(self) -> docker.DockerClient:
        """The shared client for short calls.

        :raises DockerUnavailable: the daemon cannot be asked.
        """
        with self._lock:
            if self._client is None:
                try:
                    self._client = self.new_client()
                except (docker.errors.DockerException, OSError, ValueError) as exc:
                    raise DockerUnavailable(engine_error(self.socket, exc)) from None
            return self._client

    def inspect(self, ref: str, client: docker.DockerClient | None = None) -> dict[str, Any] | None:
        """The container's inspect, or None when there is no such container.
        ``ref`` is a full container id (a name or a short id would be looked up
        by prefix too: :meth:`found` finds the id first)."""
        try:
            attrs: dict[str, Any] = (client or self.client()).api.inspect_container(ref)
        except docker.errors.NotFound:
            return None
        return attrs

    def _listed(
        self, client: docker.DockerClient, how: Literal["name", "labels"], name: str
    ) -> list[dict[str, Any]]:
        """The containers that are the rank's by ``how`` (:func:`rank_match`):
        the Engine's filters narrow the list (its name filter matches a part
        of a name), the one rule decides."""
        labels = self.docker.adopt_labels if how == "labels" else {}
        filters: dict[str, Any] = (
            {"label": [f"{k}={v}" for k, v in sorted(labels.items())]}
            if how == "labels"
            else {"name": name}
        )
        listed = client.api.containers(all=True, filters=filters)
        return [
            c
            for c in listed
            if rank_match(name, labels, c.get("Names") or [], c.get("Labels") or {}) == how
        ]

    def found(self) -> dict[str, Any] | None:
        """The rank's container if there is one: by exact name, else by the adopt
        labels; inspected by its full id.

        :raises DockerUnavailable: the daemon cannot be asked.
        :raises LaunchFailed: the labels match more than one container.
        """
        try:
            client = self.client()
            matches = self._listed(client, "name", self.docker.name)
            if not matches and self.docker.adopt_labels:
                matches = self._listed(client, "labels", self.docker.name)
        except docker.errors.DockerException as exc:
            raise DockerUnavailable(engine_error(self.socket, exc)) from None
        if len(matches) > 1:
            names = ", ".join(
                sorted(str((m.get("Names") or ["?"])[0]).lstrip("/") for m in matches)
            )
            raise LaunchFailed(
                f"serving.docker.adopt_labels match {len(matches)} containers ({names}); "
                "name one container (serving.docker.name) or narrow the labels"
            )
        return self.inspect(str(matches[0]["Id"])) if matches else None

    def adopt(self, log_file: Path) -> tuple[ContainerRank, list[str], str | None] | None:
        """The running container of an earlier agent or of the operator: watched from
        now on, with its command and (where this agent made it) its profile."""
        try:
            attrs = self.found()
        except LaunchFailed as exc:
            log.warning("serving: not adopting a container: %s", exc)
            return None
        if attrs is None or attrs.get("State", {}).get("Status") not in _LIVE:
            return None
        self._spec = attrs
        config = attrs.get("Config") or {}
        argv = _spec_argv(attrs)
        profile = (config.get("Labels") or {}).get(LABEL_PROFILE)
        rank = ContainerRank(
            self, str(attrs["Id"]), adopted=True, log_file=log_file, since=time.time()
        )
        log.info(
            "serving: adopted container %s (%s), profile %s",
            str(attrs.get("Name", "")).lstrip("/"),
            str(attrs["Id"])[:12],
            profile or "unknown",
        )
        return rank, [str(a) for a in argv], profile

    def leftover(self) -> str | None:
        """:raises DockerUnavailable: the daemon cannot be asked."""
        try:
            attrs = self.found()
        except DockerUnavailable:
            raise
        except LaunchFailed as exc:
            return str(exc)
        if attrs is not None and attrs.get("State", {}).get("Status") in _LIVE:
            name = str(attrs.get("Name", "")).lstrip("/")
            return f"container {name} ({str(attrs['Id'])[:12]}) still runs; stop it first"
        if self.process_match and rank_process_alive(self.process_match):
            return (
                f'a process matching probes.vllm.process_match "{self.process_match}" '
                "still runs (a rank outside the container?); stop it first"
            )
        return None

    # -- what a start creates ----------------------------------------------------------

    def _found_spec(self) -> dict[str, Any] | None:
        """The container to re-create: the last one adopted, else whatever of that
        name or labels the Engine still has (an ended one holds its spec too)."""
        if self._spec is not None:
            return self._spec
        try:
            attrs = self.found()
        except LaunchFailed:
            return None
        if attrs is not None:
            self._spec = attrs
        return attrs

    def base_command(self, configured: list[str]) -> list[str]:
        if not self.config.recreates_found_container:
            return configured
        spec = self._found_spec()
        if spec is None:
            raise LaunchFailed(self._nothing_to_recreate())
        entrypoint, command = _base_command(spec)
        return [*entrypoint, *command]

    def _nothing_to_recreate(self) -> str:
        wanted = f"container {self.docker.name}" + (
            " or one labelled "
            + ", ".join(f"{k}={v}" for k, v in sorted(self.docker.adopt_labels.items()))
            if self.docker.adopt_labels
            else ""
        )
        return (
            f"no {wanted} to re-create: this agent has not seen the launcher's container "
            "and the Docker Engine has none; start serving with the cluster's launcher "
            "(the agent adopts the container as it starts), or give serving.command and "
            "serving.docker.image"
        )

    def creates_from(self) -> dict[str, Any]:
        if not self.config.recreates_found_container:
            return {"source": "config", "detail": f"image {self.docker.image}"}
        spec = self._spec
        if spec is None:
            return {"source": None, "detail": self._nothing_to_recreate()}
        name = str(spec.get("Name", "")).lstrip("/")
        image = (spec.get("Config") or {}).get("Image")
        return {"source": "found_container", "detail": f"container {name} (image {image})"}

    # -- arrivals -----------------------------------------------------------------------

    def watch_arrivals(self, arrived: Callable[[], None]) -> None:
        threading.Thread(
            target=self._follow_arrivals, args=(arrived,), name="docker-arrivals", daemon=True
        ).start()

    def close(self) -> None:
        """Stop following arrivals (at the next event or reconnect)."""
        self._closed.set()

    def _matches(self, attributes: dict[str, Any]) -> bool:
        """A ``start`` event's container (its attributes: name and labels) is the rank's."""
        name = attributes.get("name")
        names = [name] if isinstance(name, str) else []
        wanted = self.docker
        return rank_match(wanted.name, wanted.adopt_labels, names, attributes) is not None

    @staticmethod
    def _tell(arrived: Callable[[], None]) -> None:
        """An adoption that fails is logged; the stream goes on."""
        try:
            arrived()
        except Exception:
            log.exception("serving: adopting a container that started")

    def _follow_arrivals(self, arrived: Callable[[], None]) -> None:
        """The daemon's ``start`` events of containers named or labelled as the rank:
        one stream, nothing polled while nothing starts."""
        backoff = 0
        while not self._closed.is_set():
            try:
                client = self.new_client()
                events = client.api.events(
                    decode=True, filters={"type": "container", "event": "start"}
                )
                backoff = 0
                # A start while the stream was down (a dockerd restart) sent no event.
                self._tell(arrived)
                for event in events:
                    if self._closed.is_set():
                        break
                    actor = event.get("Actor") or {}
                    if self._matches(actor.get("Attributes") or {}):
                        self._tell(arrived)
                with contextlib.suppress(Exception):
                    events.close()
            except (docker.errors.DockerException, OSError, ValueError) as exc:
                log.debug("serving: following container starts: %s", exc)
            if self._closed.wait(_RECONNECT_S[min(backoff, len(_RECONNECT_S) - 1)]):
                return
            backoff += 1

    # -- starting -------------------------------------------------------------------------

    def launch(
        self, argv: list[str], environment: dict[str, str], log_file: Path, profile: str
    ) -> ContainerRank:
        if self.config.recreates_found_container:
            return self._recreate(argv, environment, log_file, profile)
        image = self.docker.image
        if image is None:  # the config requires it with this runtime
            raise LaunchFailed("serving.docker.image: not set")
        client = self.client()
        self._remove_old(client)
        labels = {LABEL_PROFILE: profile}
        if self.node:
            labels[LABEL_NODE] = self.node
        options: dict[str, Any] = {
            "command": argv,
            "name": self.docker.name,
            "labels": labels,
            "environment": environment,
            "network_mode": "host",
            "ipc_mode": self.docker.ipc,
            "privileged": self.docker.privileged,
            "restart_policy": {"Name": "no"},
            "volumes": list(self.docker.volumes),
            "detach": True,
        }
        if self.docker.gpus == "all":
            options["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        if self.docker.shm_size_bytes is not None:
            options["shm_size"] = self.docker.shm_size_bytes
        if self.docker.user:
            options["user"] = self.docker.user
        if self.config.working_directory:
            options["working_dir"] = self.config.working_directory
        since = time.time()
        try:
            container = client.containers.create(image, **options)
        except docker.errors.ImageNotFound:
            raise LaunchFailed(
                f"serving.docker.image {self.docker.image}: no such image in the Docker Engine "
                f"at {self.socket} (docker pull {self.docker.image}, or build it there)"
            ) from None
        except docker.errors.DockerException as exc:
            raise LaunchFailed(f"creating container {self.docker.name}: {exc}") from None
        try:
            container.start()
        except docker.errors.DockerException as exc:
            with contextlib.suppress(docker.errors.DockerException):
                container.remove(force=True)
            raise LaunchFailed(f"starting container {self.docker.name}: {exc}") from None
        return ContainerRank(self, str(container.id), adopted=False, log_file=log_file, since=since)

    def _recreate(
        self, argv: list[str], environment: dict[str, str], log_file: Path, profile: str
    ) -> ContainerRank:
        """The launcher's container made anew from its spec, ``argv`` (its command
        with the profile merged) in place of its command."""
        spec = self._found_spec()
        if spec is None:
            raise LaunchFailed(self._nothing_to_recreate())
        config = spec.get("Config") or {}
        name = str(spec.get("Name", "")).lstrip("/") or self.docker.name
        entrypoint, command = _base_command(spec)
        # A profile rewrites flag values in place or appends: the split holds.
        split = len(entrypoint)
        env = dict(str(item).partition("=")[::2] for item in config.get("Env") or [])
        env.update(environment)
        labels = dict(config.get("Labels") or {})
        labels[LABEL_PROFILE] = profile
        labels[LABEL_BASE_COMMAND] = json.dumps({"entrypoint": entrypoint, "command": command})
        if self.node:
            labels[LABEL_NODE] = self.node
        host_config = dict(spec.get("HostConfig") or {})
        host_config["RestartPolicy"] = {"Name": "no", "MaximumRetryCount": 0}
        client = self.client()
        self._remove_old(client, name)
        since = time.time()
        created: dict[str, Any] = {}
        try:
            created = client.api.create_container(
                str(config.get("Image")),
                command=argv[split:],
                entrypoint=argv[:split] if split else None,
                name=name,
                labels=labels,
                environment=[f"{k}={v}" for k, v in env.items()],
                user=config.get("User") or None,
                working_dir=config.get("WorkingDir") or None,
                stop_signal=config.get("StopSignal") or None,
                tty=bool(config.get("Tty")),
                host_config=host_config,
            )
            client.api.start(created["Id"])
        except docker.errors.ImageNotFound:
            raise LaunchFailed(
                f"re-creating container {name}: its image {config.get('Image')} is no longer "
                f"in the Docker Engine at {self.socket} (pull it again)"
            ) from None
        except docker.errors.DockerException as exc:
            if created.get("Id"):  # only the one just made, by its id
                with contextlib.suppress(docker.errors.DockerException):
                    client.api.remove_container(str(created["Id"]), force=True)
            raise LaunchFailed(f"re-creating container {name}: {exc}") from None
        cid = str(created["Id"])
        self._spec = self.inspect(cid, client) or spec
        return ContainerRank(self, cid, adopted=False, log_file=log_file, since=since)

    def _remove_old(self, client: docker.DockerClient, name: str | None = None) -> None:
        """The previous container of exactly that name (ended: leftover() refused a
        live one), removed by its id, so the name is free."""
        name = name or self.docker.name
        try:
            for old in self._listed(client, "name", name):
                client.api.remove_container(str(old["Id"]), v=False, force=False)
        except docker.errors.NotFound:
            return
        except docker.errors.DockerException as exc:
            raise LaunchFailed(f"removing the previous container {name}: {exc}") from None


def _base_command(attrs: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The launcher's entrypoint and command: from the label the agent left on a
    container it re-created, else the container's own."""
    config = attrs.get("Config") or {}
    text = (config.get("Labels") or {}).get(LABEL_BASE_COMMAND)
    if text:
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            base = json.loads(text)
            entrypoint, command = base["entrypoint"], base["command"]
            if all(isinstance(a, str) for a in (*entrypoint, *command)):
                return list(entrypoint), list(command)
    return (
        [str(a) for a in config.get("Entrypoint") or []],
        [str(a) for a in config.get("Cmd") or []],
    )


def _spec_argv(attrs: dict[str, Any]) -> list[str]:
    """A container's command as its main process got it: entrypoint, then command."""
    config = attrs.get("Config") or {}
    return [str(a) for a in (*(config.get("Entrypoint") or []), *(config.get("Cmd") or []))]
