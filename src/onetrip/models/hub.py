"""Hugging Face Hub model ids -> local checkpoint directories, through the hub cache.

    hub = parse_hub_id("Qwen/Qwen3-0.6B@main")     # HubId("Qwen/Qwen3-0.6B", "main"); None if not an id
    path = snapshot(hub)                           # .../models--Qwen--Qwen3-0.6B/snapshots/<commit>

``snapshot`` fetches what onetrip reads (config.json, the tokenizer files, the safetensors
weights; nothing else of the repository) with ``huggingface_hub.snapshot_download`` into
the hub cache: ``HF_HUB_CACHE``, else ``HF_HOME``/hub, else ~/.cache/huggingface/hub, read
from the environment at each call (huggingface_hub reads it once, at import). With
``HF_HUB_OFFLINE=1`` it reads the cache only and never opens a connection.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .loader import INDEX_FILE, SINGLE_FILE

# What the loader and the tokenizer read; shards are fetched from the index's list.
METADATA_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "chat_template.jinja", "chat_template.json", INDEX_FILE)
# The Hub's rule for a name: letters, digits, '-', '_', '.'; no '--' or '..'; '-' and '.' neither
# first nor last; at most 96 characters.
_NAME = r"(?![^/@]*(?:--|\.\.))[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"({_NAME}/{_NAME})(?:@(.+))?")
_TRUE = ("1", "ON", "YES", "TRUE")


@dataclass(frozen=True)
class HubId:
    """A model repository on the Hub, ``org/name``, at ``revision`` (a branch, tag or commit;
    None: the default branch)."""

    repo_id: str
    revision: Optional[str] = None

    @property
    def name(self) -> str:
        """The repository's name without its owner (``Llama-3.2-1B``)."""
        return self.repo_id.split("/")[1]

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"


def parse_hub_id(spec: str) -> Optional[HubId]:
    """``org/name`` or ``org/name@revision`` as a HubId; None for anything else."""
    match = _HUB_ID.fullmatch(spec)
    return None if match is None else HubId(match[1], match[2])


def hub_cache_dir() -> Path:
    """The hub cache the environment names now, by huggingface_hub's rule: HF_HUB_CACHE,
    HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set to 1/ON/YES/TRUE now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def fetch_command(hub: HubId) -> str:
    """The shell commands that put ``hub``'s files into a hub cache on a machine with network."""
    revision = f" --revision {hub.revision}" if hub.revision else ""
    return (f"`hf download {hub.repo_id}{revision} --include '*.json' --include '*.safetensors' "
            f"--include '*.jinja'` (before huggingface_hub 1.0: `huggingface-cli download {hub.repo_id}{revision}`)")


def snapshot(hub: HubId) -> Path:
    """The snapshot directory of ``hub`` in the hub cache, holding config.json, the tokenizer
    files the repository has and its safetensors weights (model.safetensors, or
    model.safetensors.index.json and every shard it lists). Downloads what is missing
    unless offline (``hub_offline()``).

    Raises ValueError naming the model when it is offline and not (completely) in the
    cache, saying how to fetch it; when the Hub cannot be reached and it is not cached;
    when the repository or revision does not exist or is gated; when the snapshot has no
    config.json or no safetensors weights.
    """
    folder = _download(hub, hub.revision, list(METADATA_FILES) + [SINGLE_FILE])
    if not (folder / "config.json").is_file():
        raise ValueError(f"Hub model {str(hub)!r} has no config.json ({str(folder)!r}): not a transformers "
                         f"model repository")
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            shards = []  # the loader names what is wrong with the index
        if shards:  # the commit just resolved: the same files even if the branch moves meanwhile
            _download(hub, folder.name, shards)
    elif not (folder / SINGLE_FILE).is_file():
        raise ValueError(f"Hub model {str(hub)!r} has neither {SINGLE_FILE} nor {INDEX_FILE} in {str(folder)!r}: "
                         f"the repository has no safetensors weights (onetrip reads no other format), or the "
                         f"cache holds part of it; fetch it with {fetch_command(hub)}")
    return folder


def _download(hub: HubId, revision: Optional[str], patterns: list[str]) -> Path:
    """``snapshot_download`` of the files of ``hub`` at ``revision`` that match ``patterns``
    (into the cache, or from it only when offline); its errors as ValueErrors that say what
    to do. Other HTTP errors (the Hub down) pass through as huggingface_hub's (OSErrors)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import (GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                       RevisionNotFoundError)

    cache, offline = hub_cache_dir(), hub_offline()
    try:
        return Path(snapshot_download(hub.repo_id, revision=revision, cache_dir=cache, local_files_only=offline,
                                      allow_patterns=patterns))
    except LocalEntryNotFoundError as exc:
        reason = exc.__cause__ or exc
        where = ("offline mode (HF_HUB_OFFLINE=1) allows no download" if offline else
                 f"the Hub cannot be reached ({type(reason).__name__}: {reason})")
        raise ValueError(f"Hub model {str(hub)!r} is not (completely) in the hub cache {str(cache)!r} and {where}; "
                         f"on a machine with network, fetch it into that cache (HF_HUB_CACHE) with "
                         f"{fetch_command(hub)}, or pass a local directory") from None
    except GatedRepoError:
        raise ValueError(f"Hub model {hub.repo_id!r} is gated: accept its license on huggingface.co, then log "
                         f"in (`hf auth login`) or set HF_TOKEN") from None
    except RevisionNotFoundError:
        raise ValueError(f"Hub model {hub.repo_id!r} has no revision {revision!r}") from None
    except RepositoryNotFoundError:
        raise ValueError(f"Hub model {hub.repo_id!r} does not exist, or is private (log in with "
                         f"`hf auth login` or set HF_TOKEN)") from None
