"""Read a YAML config file, turning every failure into a ConfigError.

A config file must be a regular file of at most :data:`CONFIG_MAX_BYTES`: a
FIFO would block the reader forever and ``/dev/zero`` would fill the memory,
so both are refused from ``os.stat`` before anything is read.

The YAML is composed by :class:`ConfigLoader`, PyYAML's pure-Python safe
loader with three limits added while the document is composed:

- at most :data:`YAML_MAX_VALUES` values, counting an alias as every value
  it stands for (aliases reuse one node, so ``&a [*b, *b]`` chains double at
  each step: an "alias bomb" of a few lines would otherwise expand to
  gigabytes when the schema walks it);
- at most :data:`YAML_MAX_DEPTH` levels of nesting, aliases included (a
  10,000-deep list otherwise ends in RecursionError);
- no mapping key given twice (PyYAML would keep the last one silently).

Each problem names the line and the key path. The C loader (libyaml) is not
used: its composer cannot be limited this way and recurses in C, and a config
file is small and read once at start, so the pure-Python speed is no concern.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent, MappingEndEvent, SequenceEndEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from spark_watchdog.errors import ConfigError

CONFIG_MAX_BYTES = 1024 * 1024
YAML_MAX_VALUES = 100_000
YAML_MAX_DEPTH = 64

_MERGE_TAG = "tag:yaml.org,2002:merge"


class FileRefused(Exception):
    """A file that is not read: missing, not a regular file, too big, unreadable."""

    def __init__(self, reason: str, *, missing: bool = False, unreadable: bool = False) -> None:
        self.reason = reason
        self.missing = missing  # it does not exist
        self.unreadable = unreadable  # open or read failed (permissions, I/O)
        super().__init__(reason)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _size_text(limit: int) -> str:
    return f"{limit // 1024 // 1024} MiB" if limit >= 1024 * 1024 else f"{limit // 1024} KiB"


def read_regular_file(path: Path, limit: int) -> tuple[bytes, os.stat_result]:
    """The bytes of ``path`` and its ``fstat``, refusing anything but a regular file of
    at most ``limit`` bytes. Raises :class:`FileRefused` with a reason that names no path."""
    try:
        before = os.stat(path)
    except FileNotFoundError:
        raise FileRefused("does not exist", missing=True) from None
    except OSError as exc:
        raise FileRefused(f"cannot be read: {exc.strerror or exc}", unreadable=True) from None
    if not stat.S_ISREG(before.st_mode):
        raise FileRefused(f"is {_kind(before.st_mode)}, not a regular file")
    if before.st_size > limit:
        raise FileRefused(f"is {before.st_size} bytes, more than the limit of {_size_text(limit)}")
    try:
        # O_NONBLOCK: should the path become a FIFO after the stat, open does not wait.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise FileRefused(f"cannot be read: {exc.strerror or exc}", unreadable=True) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(f"is {_kind(info.st_mode)}, not a regular file")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise FileRefused(f"cannot be read: {exc.strerror or exc}", unreadable=True) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise FileRefused(f"is more than the limit of {_size_text(limit)}")
    return data, info


class YamlLimitError(yaml.YAMLError):
    """A document over a limit of :class:`ConfigLoader`, or with a duplicate key."""

    def __init__(self, mark: Any, path: str, problem: str) -> None:
        self.mark = mark
        self.path = path
        self.problem = problem
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        named = f"{path}: " if path else ""
        super().__init__(f"{where}{named}{problem}")


def _short(path: str) -> str:
    return path if len(path) <= 100 else path[:80] + "…"


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader with value-count, depth and duplicate-key limits (module doc)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path: list[str] = []
        # Per node (by id; the nodes live as long as the loader): the number of
        # values it expands to, and the depth of nesting below it.
        self._size: dict[int, int] = {}
        self._height: dict[int, int] = {}
        self._open: set[int] = set()  # collections still being composed
        # PyYAML's parser and resolver methods are untyped in its stubs.
        self._events: Any = self

    def _where(self) -> str:
        text = ""
        for part in self._path:
            text = text + part if part.startswith("[") or not text else f"{text}.{part}"
        return _short(text)

    def _refuse(self, mark: Any, problem: str) -> YamlLimitError:
        return YamlLimitError(mark, self._where(), problem)

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        depth = len(self._path)
        if self._events.check_event(AliasEvent):
            event = self._events.peek_event()
            node = self.anchors.get(event.anchor)
            if node is not None:
                if id(node) in self._open:
                    self._events.get_event()
                    raise self._refuse(
                        event.start_mark,
                        f"alias *{event.anchor} refers to a collection it is inside "
                        "(a structure without end); a config cannot hold one",
                    )
                if depth + self._height[id(node)] >= YAML_MAX_DEPTH:
                    raise self._refuse(
                        event.start_mark,
                        f"alias *{event.anchor} nests values deeper than {YAML_MAX_DEPTH} levels",
                    )
            return super().compose_node(parent, index)
        if depth >= YAML_MAX_DEPTH:
            raise self._refuse(
                self._events.peek_event().start_mark,
                f"values nest deeper than {YAML_MAX_DEPTH} levels; a config needs far fewer",
            )
        return super().compose_node(parent, index)

    def _count(self, node: Node, size: int, height: int) -> None:
        if size > YAML_MAX_VALUES:
            raise self._refuse(
                node.start_mark,
                f"the document expands to more than {YAML_MAX_VALUES} values (an alias "
                "counts as every value it stands for); a config is far smaller: look for "
                "aliases that repeat large parts",
            )
        self._size[id(node)] = size
        self._height[id(node)] = height

    def _child(self, node: Node) -> tuple[int, int]:
        return self._size.get(id(node), 1), self._height.get(id(node), 0)

    def compose_scalar_node(self, anchor: Any) -> ScalarNode:
        node: ScalarNode = super().compose_scalar_node(anchor)
        self._count(node, 1, 0)
        return node

    def compose_sequence_node(self, anchor: Any) -> SequenceNode:
        start_event = self._events.get_event()
        tag = start_event.tag
        if tag is None or tag == "!":
            tag = self._events.resolve(SequenceNode, None, start_event.implicit)
        node = SequenceNode(
            tag, [], start_event.start_mark, None, flow_style=start_event.flow_style
        )
        if anchor is not None:
            self.anchors[anchor] = node
        self._open.add(id(node))
        size, height = 1, 1
        index = 0
        while not self._events.check_event(SequenceEndEvent):
            self._path.append(f"[{index}]")
            item = self.compose_node(node, index)
            self._path.pop()
            assert item is not None
            node.value.append(item)
            item_size, item_height = self._child(item)
            size += item_size
            height = max(height, item_height + 1)
            self._count(node, size, height)
            index += 1
        end_event = self._events.get_event()
        node.end_mark = end_event.end_mark
        self._open.discard(id(node))
        self._count(node, size, height)
        return node

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        start_event = self._events.get_event()
        tag = start_event.tag
        if tag is None or tag == "!":
            tag = self._events.resolve(MappingNode, None, start_event.implicit)
        node = MappingNode(tag, [], start_event.start_mark, None, flow_style=start_event.flow_style)
        if anchor is not None:
            self.anchors[anchor] = node
        self._open.add(id(node))
        size, height = 1, 1
        seen: dict[Any, int] = {}
        while not self._events.check_event(MappingEndEvent):
            self._path.append("?")
            key = self.compose_node(node, None)
            self._path.pop()
            assert key is not None
            name = self._key_name(key)
            if name is not None and key.tag != _MERGE_TAG:
                identity = self._key_identity(key)
                if identity in seen:
                    self._path.append(name)
                    problem = self._refuse(
                        key.start_mark,
                        f"duplicate key (first given on line {seen[identity] + 1}); "
                        "keep one of them",
                    )
                    self._path.pop()
                    raise problem
                seen[identity] = key.start_mark.line
            self._path.append(name if name is not None else "?")
            value = self.compose_node(node, key)
            self._path.pop()
            assert value is not None
            node.value.append((key, value))
            for part in (key, value):
                part_size, part_height = self._child(part)
                size += part_size
                height = max(height, part_height + 1)
            self._count(node, size, height)
        end_event = self._events.get_event()
        node.end_mark = end_event.end_mark
        self._open.discard(id(node))
        self._count(node, size, height)
        return node

    @staticmethod
    def _key_name(key: Node) -> str | None:
        return str(key.value) if isinstance(key, ScalarNode) else None

    def _key_identity(self, key: Node) -> Any:
        """What the key constructs to (``1`` and ``0x1`` are one int key); its text if
        that is not hashable."""
        try:
            value = self.construct_object(key)
            hash(value)
        except (yaml.YAMLError, TypeError):
            return (key.tag, key.value)
        return (type(value).__name__, value)


def parse_yaml(text: str, source: str) -> Any:
    """Parse one YAML document with :class:`ConfigLoader`; problems are a ConfigError."""
    try:
        # The reader checks the characters when the loader is built: a NUL or
        # another control character is a ReaderError here, not a traceback.
        loader = ConfigLoader(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"not valid YAML ({' '.join(str(exc).split())})"]) from None
    try:
        return loader.get_single_data()
    except YamlLimitError as exc:
        raise ConfigError(source, [str(exc)]) from None
    except RecursionError:
        raise ConfigError(
            source, [f"values nest too deeply; a config needs fewer than {YAML_MAX_DEPTH} levels"]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [f"{where}not valid YAML ({problem})"]) from None
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> Any:
    """Parse ``path``; a missing or unreadable file, one that is not a regular file or
    is over :data:`CONFIG_MAX_BYTES`, and a YAML error or limit are a ConfigError."""
    source = str(path)
    try:
        data, _ = read_regular_file(Path(path), CONFIG_MAX_BYTES)
    except FileRefused as exc:
        if exc.missing:
            raise ConfigError(source, ["file not found; pass an existing --config FILE"]) from None
        if exc.unreadable:
            raise ConfigError(source, [f"the config file {exc.reason}"]) from None
        raise ConfigError(
            source,
            [
                f"the config file {exc.reason}; pass a regular YAML file of at most "
                f"{_size_text(CONFIG_MAX_BYTES)}"
            ],
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [f"cannot read the file: not UTF-8 text ({exc})"]) from None
    return parse_yaml(text, source)
