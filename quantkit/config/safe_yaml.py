"""YAML read with limits: every YAML file quantkit reads goes through ``load_yaml_file``.

A YAML file is small, but what it stands for need not be: aliases let a few hundred bytes name
a billion strings ("billion laughs"), and deep nesting makes every recursive reader overflow
Python's stack. Three limits, each refused with one line naming the file and the limit:

- ``MAX_YAML_BYTES``: the file's size (1 MiB; the largest shipped recipe is under 1 KiB);
- ``MAX_EXPANDED_NODES`` / ``MAX_EXPANDED_CHARS``: the nodes, and the scalar characters, the
  document holds once every alias is expanded. Counted while the document is composed, from
  each node's own size, so an alias bomb is refused without ever being expanded;
- ``MAX_DEPTH``: how deeply collections nest (64), checked before the composer recurses.

Aliases stay allowed: reusing one scheme block under several ``config_groups`` with an anchor
is ordinary YAML, and counting their expansion bounds them as well as refusing them would.
An alias to a collection that is still open (a recursive structure) is refused: expanded, it
has no end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from quantkit.errors import QuantkitError

MAX_YAML_BYTES = 1 << 20
MAX_EXPANDED_NODES = 100_000
MAX_EXPANDED_CHARS = 4 << 20
MAX_DEPTH = 64


class YamlLimitError(yaml.YAMLError):
    """A document over one of this module's limits; the message names the limit."""


class LimitedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that counts, while composing, each node's expanded size and depth."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        # id(node) -> (nodes, characters) it stands for with its aliases expanded; the nodes are
        # kept alive by the composed document, so an id is never reused while this runs
        self._sizes: dict[int, tuple[int, int]] = {}

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = self.anchors.get(event.anchor)
            if node is not None and id(node) not in self._sizes:
                raise YamlLimitError(f"alias *{event.anchor[:40]} refers to a collection that contains it "
                                     "(a recursive structure)")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YamlLimitError(f"nested deeper than {MAX_DEPTH} levels (the limit)")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._sizes[id(node)] = size = self._size_of(node)
        if size[0] > MAX_EXPANDED_NODES:
            raise YamlLimitError(f"more than {MAX_EXPANDED_NODES} nodes once aliases are expanded (the limit)")
        if size[1] > MAX_EXPANDED_CHARS:
            raise YamlLimitError(f"more than {MAX_EXPANDED_CHARS} characters once aliases are expanded (the limit)")
        return node

    def _size_of(self, node: Node) -> tuple[int, int]:
        if isinstance(node, ScalarNode):
            return 1, len(node.value)
        if isinstance(node, SequenceNode):
            children = node.value
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            return 1, 0
        nodes, chars = 1, 0
        for child in children:
            n, c = self._sizes[id(child)]
            nodes, chars = nodes + n, chars + c
        return nodes, chars


def load_yaml_text(text: str) -> Any:
    """One YAML document from ``text`` under the limits (``yaml.YAMLError`` when it breaks one)."""
    loader = LimitedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_yaml_file(path: Path, what: str = "YAML file") -> Any:
    """The YAML document in ``path`` read under the limits, or one ``QuantkitError`` line naming
    ``path`` (missing, a folder, unreadable, over a limit, not YAML). ``what`` names the file's
    role in those lines ("recipe")."""
    try:
        with open(path, "rb") as fh:
            # reads one byte past the limit: a FIFO or a growing file is bounded the same way
            data = fh.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise QuantkitError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise QuantkitError(f"{path}: is a folder, not a {what}") from None
    except OSError as e:
        raise QuantkitError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    if len(data) > MAX_YAML_BYTES:
        raise QuantkitError(f"{path}: larger than {MAX_YAML_BYTES} bytes (the limit for a {what})")
    try:
        return load_yaml_text(data.decode("utf-8"))
    except YamlLimitError as e:
        raise QuantkitError(f"{path}: {e}") from None
    except (yaml.YAMLError, UnicodeDecodeError, ValueError, RecursionError) as e:
        # ValueError: an integer past Python's digit limit, a bad timestamp
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise QuantkitError(f"{path}: not valid YAML ({first})") from None
