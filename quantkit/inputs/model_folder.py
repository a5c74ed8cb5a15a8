"""A model folder is untrusted input: which of its links are followed, which of its files travel
into a checkpoint. Nothing here imports torch, so every command can check a folder first."""

from __future__ import annotations

import os
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.config.validation import json_object


# The files of a model folder that travel with its checkpoint, by name: nothing else the folder
# holds (keys, notes, a link to a file outside it) ever reaches a checkpoint that may be published.
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
              "generation_config.json", "chat_template.jinja", "chat_template.json", "vocab.json", "vocab.txt",
              "merges.txt", "added_tokens.json", "README.md")
# the largest side file copied: tokenizers of 256k-token vocabularies are about 35 MB
SIDE_FILE_LIMIT = 128 * 2**20


def copy_side_files(src: Path | None, dst: Path) -> list[str]:
    """Copy the known side files (``SIDE_FILES``: tokenizer, chat template, generation config and
    the model card, whose ``language:`` the evaluation gates on) next to the weights; a larger one
    than ``SIDE_FILE_LIMIT``, or a link that leaves the folder, is refused with its name."""
    if src is None:
        return []
    check_links(src)
    copied = []
    for name in SIDE_FILES:
        p = src / name
        if not p.is_file():
            continue
        if p.stat().st_size > SIDE_FILE_LIMIT:
            raise QuantkitError(f"{p}: {p.stat().st_size} bytes, more than a side file may hold "
                                f"({SIDE_FILE_LIMIT} bytes); not copied into the checkpoint")
        with open(p, "rb") as fi, open(dst / p.name, "wb") as fo:
            fo.write(fi.read(SIDE_FILE_LIMIT + 1))
        copied.append(p.name)
    return copied


def check_links(folder: str | Path) -> None:
    """A model folder is untrusted input: a symbolic link in it is followed only when its target
    lies inside the folder, or inside the Hugging Face cache repository the folder is a snapshot
    of (``models--ORG--NAME/snapshots/REV`` links into ``models--ORG--NAME/blobs``). Any other
    link is refused with one line naming it (a ``chat_template.jinja -> /etc/passwd`` would
    otherwise be copied into a checkpoint that gets published)."""
    folder = Path(folder)
    root = Path(os.path.realpath(folder))
    allowed = root.parent.parent if (root.parent.name == "snapshots"
                                     and root.parent.parent.name.startswith("models--")) else root
    try:
        entries = sorted(folder.iterdir())
    except OSError as e:
        raise QuantkitError(f"{folder}: cannot list the model folder ({e.strerror or e})") from None
    for p in entries:
        if not p.is_symlink():
            continue
        target = Path(os.path.realpath(p))
        if target != allowed and allowed not in target.parents:
            raise QuantkitError(f"{p}: a symbolic link to {target}, outside the model folder; quantkit follows "
                                "links only within it (copy the file in if you mean it)")


def read_config_json(folder: str | Path) -> dict:
    """A model folder's ``config.json`` as a mapping, or one line naming the file and the fault."""
    path = Path(folder) / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QuantkitError(f"{path}: not found (is this a Hugging Face model folder?)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise QuantkitError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    if not text.strip():
        raise QuantkitError(f"{path}: empty file, not a model config")
    return json_object(text, str(path))
