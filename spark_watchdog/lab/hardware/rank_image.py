"""The image of the lab's containerized ranks (``lab ... --serving docker``),
made on this machine in a second, offline, from nothing but the machine itself.

The image is a skeleton: the top-level directories of a Linux root, the
machine's own ``/bin``, ``/lib``... links into ``/usr``, and a one-line
``/etc/passwd``. What runs in it is bound in read-only at the paths it has
here: ``/usr`` (the C library, and ``python3`` where Python comes from the
distribution), the Python installation and the environment the lab runs from
(a venv, pyenv), and this package's own directory where it is not installed in
that environment (a checkout). So the container runs the lab's vLLM stand-in
with exactly the code of the lab that started it, and nothing is pulled from
a registry.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import spark_watchdog

if TYPE_CHECKING:
    import docker

REPOSITORY = "spark-watchdog-lab/rank"
_DIRECTORIES = ("dev", "etc", "proc", "root", "run", "sys", "tmp", "var/tmp", "usr")
_ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_PASSWD = b"root:x:0:0:root:/root:/bin/sh\n"
_GROUP = b"root:x:0:\n"


@dataclass(frozen=True)
class RankImage:
    """The image's tag, and the binds that give its containers this machine's Python."""

    tag: str
    volumes: tuple[str, ...]
    python: str  # the interpreter to start in the container (a path bound in)


def bound_paths() -> list[str]:
    """What the container needs from this machine, outermost paths only:
    ``/usr``, the root directories that are not links into it, the Python
    installation, the environment, and the package's own directory."""
    wanted = [Path("/usr")]
    for name in _ROOT_LINKS:
        path = Path("/") / name
        if path.is_dir() and not path.is_symlink():
            wanted.append(path)
    package_parent = Path(spark_watchdog.__file__).resolve().parent.parent
    for path in (Path(sys.base_prefix), Path(sys.prefix), package_parent):
        wanted.append(path.resolve())
    kept: list[Path] = []
    for path in sorted(set(wanted), key=lambda p: len(p.parts)):
        if path == Path("/"):
            raise ValueError("the lab's Python lives at /: it cannot be bound into a container")
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return [str(p) for p in kept]


def _skeleton() -> bytes:
    """The image's root file system, as a tar in memory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in _DIRECTORIES:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if name.endswith("tmp") else 0o755
            tar.addfile(info)
        for name in _ROOT_LINKS:
            path = Path("/") / name
            if path.is_symlink():
                info = tarfile.TarInfo(name)
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(path)
                tar.addfile(info)
        for name, content in (("etc/passwd", _PASSWD), ("etc/group", _GROUP)):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def rank_image(client: docker.DockerClient) -> RankImage:
    """Import the skeleton into the Engine behind ``client`` (once: the tag is
    its content's hash) and say how to run this machine's Python in it."""
    import docker.errors  # the docker extra

    skeleton = _skeleton()
    tag = f"{REPOSITORY}:{hashlib.sha256(skeleton).hexdigest()[:12]}"
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        client.api.import_image_from_data(skeleton, repository=tag)
    volumes = tuple(f"{path}:{path}:ro" for path in bound_paths())
    return RankImage(tag=tag, volumes=volumes, python=sys.executable)
