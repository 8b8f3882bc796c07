"""Doctor's look at a rank that runs as a container (``serving.runtime: docker``),
before an incident needs it: the Engine answers on the socket, the image is
there, no container of the rank restarts itself, and a restart will not pay
for compiling and loading the model again (docs/serving.md)."""

from __future__ import annotations

from typing import Any

from spark_watchdog.config.agent import AgentConfig
from spark_watchdog.doctor.result import Finding, fail, ok, skip, warn

# Where vLLM keeps what a restart can reuse: its compile cache and the model
# files (Hugging Face's cache). A volume onto one of these (or a path the
# environment points them at) is what makes a restart warm.
CACHE_HINTS = ("/.cache/vllm", "/.cache/huggingface", "/root/.cache", "vllm", "huggingface")
CACHE_VARIABLES = ("VLLM_CACHE_ROOT", "HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME")


def check_docker(config: AgentConfig) -> Finding:
    """The Engine, the image, the restart policy and the caches of a containerized rank."""
    serving = config.serving
    if not serving.enabled or serving.runtime != "docker":
        return skip("serving.runtime is not docker: no container to check")
    try:
        import docker
        import docker.errors
    except ImportError:
        return fail(
            "serving.runtime is docker but the Docker SDK is not installed",
            "pip install 'spark-watchdog[docker]' (deploy/install.sh installs it)",
        )
    from spark_watchdog.agent.rank_container import ContainerRuntime, engine_error

    runtime = ContainerRuntime(serving, None, config.node)
    try:
        client = runtime.client()
        version = client.version().get("Version", "?")
        found = runtime.found()
    except docker.errors.DockerException as exc:
        return fail(engine_error(serving.docker.socket, exc), _socket_fix())
    except Exception as exc:  # DockerUnavailable, LaunchFailed: already worded
        return fail(str(exc), _socket_fix())
    volumes = serving.docker.volumes
    if serving.recreates_found_container:
        # The rank is the launcher's container: its image and volumes are its own.
        if found is None:
            return warn(
                f"Docker Engine {version} on {serving.docker.socket}; no container "
                f"{serving.docker.name} (or with the adopt labels) yet: a start has nothing "
                "to re-create from until the cluster's launcher has started it once",
                "start serving with the cluster's launcher; the agent adopts its container",
            )
        volumes = tuple(found.get("HostConfig", {}).get("Binds") or ())
    image = serving.docker.image or str((found or {}).get("Config", {}).get("Image") or "")
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return fail(
            f"serving.docker.image {image}: no such image in the Docker Engine {version}",
            f"docker pull {image} (or build it on this node): a restart would fail",
        )
    except docker.errors.DockerException as exc:
        return fail(engine_error(serving.docker.socket, exc), _socket_fix())
    restarts = None if found is None else _restarting_container(found)
    if restarts is not None:
        return restarts
    detail = f"Docker Engine {version} on {serving.docker.socket}; image {image} is there"
    return _caches_finding(detail, volumes, serving.environment)


def _restarting_container(found: dict[str, Any]) -> Finding | None:
    """A fail when the Docker daemon would restart the rank's container by itself."""
    policy = (found.get("HostConfig", {}).get("RestartPolicy") or {}).get("Name") or "no"
    if policy == "no":
        return None
    name = str(found.get("Name", "")).lstrip("/")
    return fail(
        f"container {name} has restart policy {policy}: the Docker daemon restarts the "
        "rank behind the watchdog's back and undoes every safe restart",
        f"docker update --restart no {name} (and drop restart: from its compose file)",
    )


def _caches_finding(detail: str, volumes: tuple[str, ...], environment: dict[str, str]) -> Finding:
    """Ok when vLLM's caches are on volumes, a warn (every start cold) otherwise."""
    cached = _cache_volumes(volumes, environment)
    if not cached:
        return warn(
            f"{detail}; but no volume holds vLLM's compile cache or the model files: every "
            "restart compiles again and loads the model from the image (measured on real "
            "vLLM: a cold start took 105 s, a warm one 56 s; in a container without "
            "~/.cache/vllm on a volume, its model inspection alone adds about 8 s a start)",
            "mount them from the host, e.g. volumes: [/var/cache/vllm:/root/.cache/vllm, "
            "/srv/models:/root/.cache/huggingface]",
        )
    return ok(f"{detail}; caches on volumes: {', '.join(cached)}")


def _cache_volumes(volumes: tuple[str, ...], environment: dict[str, str]) -> list[str]:
    targets = {volume.split(":")[1]: volume for volume in volumes}
    hinted = [v for target, v in targets.items() if any(h in target for h in CACHE_HINTS)]
    for variable in CACHE_VARIABLES:
        path = environment.get(variable)
        if path:
            hinted += [v for target, v in targets.items() if path.startswith(target)]
    return sorted(set(hinted))


def _socket_fix() -> str:
    return (
        "start dockerd, point serving.docker.socket at its socket, and give the agent its "
        "group (systemd/spark-watchdog-agent.service.d/docker.conf)"
    )
