"""Rows of a Hugging Face hub dataset (or a local copy of one) through ``datasets.load_dataset``, as NeMo RL
reads them, honouring the user's Hugging Face cache and offline mode (``HF_HUB_OFFLINE`` /
``HF_DATASETS_OFFLINE``).

Offline, the hub cache's snapshot of the repo (what ``hf download --repo-type dataset ID`` stores) is read first,
then ``datasets``' own cache of an earlier ``load_dataset``; online, ``load_dataset`` fetches as usual. Nothing
there: one line naming the hub id, the command that fetches it and the config key that points at a local copy.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable

from rlplane.data.errors import DatasetError
from rlplane.data.registry import HubCopy, read_gzip_jsonl

FILE_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow",
                ".txt": "text"}


def _datasets(what: str):
    if importlib.util.find_spec("datasets") is None:
        raise DatasetError(f"{what}: reading it needs the datasets package: pip install 'rlplane[hf]'")
    import datasets

    datasets.disable_progress_bars()
    return datasets


def offline() -> bool:
    """Whether ``datasets`` and ``huggingface_hub`` may not reach the hub (either variable set)."""
    datasets = _datasets("offline mode")
    return bool(datasets.config.HF_HUB_OFFLINE)


def is_local(path: str) -> bool:
    """A path on this machine (a file, a directory or a glob of files), not a hub id or a URL."""
    if path.startswith(("https://", "http://", "hf://")):
        return False
    return os.path.exists(path) or any(c in path for c in "*?[") or os.path.splitext(path)[1] in FILE_FORMATS


def _cached_snapshot(repo: str) -> str | None:
    """The hub cache's snapshot directory of dataset ``repo``, or None (never goes to the network)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(repo, repo_type="dataset", local_files_only=True)
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def _split_of(ds, split: str, where: str):
    """``split`` of a ``DatasetDict`` (a ``Dataset`` is its own one split)."""
    if not hasattr(ds, "keys"):
        return ds
    if split not in ds:
        raise DatasetError(f"{where}: no split {split!r} (splits: {', '.join(ds)}); set the split")
    return ds[split]


def _local_rows(c: HubCopy, where: str) -> Iterable[dict]:
    """A local copy: a file (by extension), a glob, a ``save_to_disk`` directory, or a repo directory (a hub
    snapshot: its README's configs name the subsets and splits)."""
    datasets = _datasets(where)
    path = c.repo
    if c.file and os.path.isdir(path):
        path = os.path.join(path, c.file)
    if path.endswith(".jsonl.gz"):
        return read_gzip_jsonl(path)
    fmt = FILE_FORMATS.get(os.path.splitext(path)[1])
    try:
        if fmt is not None:
            return datasets.load_dataset(fmt, data_files=path, split="train")
        if os.path.isfile(os.path.join(path, "dataset_dict.json")) or os.path.isfile(
                os.path.join(path, "dataset_info.json")) and os.path.isfile(os.path.join(path, "state.json")):
            return _split_of(datasets.load_from_disk(path), c.split, where)
        return datasets.load_dataset(path, c.subset, split=c.split)
    except (FileNotFoundError, ValueError) as e:
        raise DatasetError(f"{where}: cannot read the local copy {path} ({_first_line(e)}); point it at a file, "
                           "a save_to_disk directory or a downloaded hub repo") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def fetch_command(c: HubCopy) -> str:
    """The command that puts ``c`` where :func:`load_rows` finds it offline."""
    if c.is_url:
        return f"curl -LO {c.repo}"
    return f"hf download --repo-type dataset {c.repo}" + (f" {c.file}" if c.file else "")


def _unavailable(c: HubCopy, where: str, path_key: str, reason: str) -> DatasetError:
    if c.is_url:
        what = c.repo
    elif c.file:
        what = f"{c.repo} (file {c.file})"
    else:
        what = f"{c.repo} ({f'subset {c.subset}, ' if c.subset else ''}split {c.split})"
    return DatasetError(f"{where}: {what} is not in the Hugging Face cache and {reason}; fetch it with "
                        f"`{fetch_command(c)}`, or set {path_key} to a local copy")


def load_rows(c: HubCopy, where: str, path_key: str) -> Iterable[dict]:
    """The rows of ``c`` (a dataset or a list of dicts). ``where`` names the config entry in errors and
    ``path_key`` is the key of a local copy."""
    if is_local(c.repo):
        return _local_rows(c, where)
    datasets = _datasets(where)
    if offline():
        if c.is_url:  # datasets keeps no copy of a URL it could find offline under its name
            raise _unavailable(c, where, path_key, "the hub is offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)")
        snapshot = _cached_snapshot(c.repo)
        if snapshot is not None:
            return _local_rows(HubCopy(snapshot, c.subset, c.split, c.file), where)
    try:
        if c.file:
            from huggingface_hub import hf_hub_download

            return read_gzip_jsonl(hf_hub_download(c.repo, c.file, repo_type="dataset"))
        if c.is_url:
            return datasets.load_dataset("csv", data_files=c.repo, split="train")
        return datasets.load_dataset(c.repo, c.subset, split=c.split)
    except ImportError as e:  # a URL needs fsspec's HTTP file system (aiohttp)
        raise DatasetError(f"{where}: reading {c.repo} needs {_first_line(e)}; or fetch it with "
                           f"`{fetch_command(c)}` and set {path_key} to the file") from None
    except ConnectionError as e:  # datasets: offline, or the hub unreachable, with nothing in its own cache
        reason = "the hub is offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)" if offline() else "the hub cannot be " \
                 f"reached ({_first_line(e)})"
        raise _unavailable(c, where, path_key, reason) from None
    except Exception as e:  # noqa: BLE001 - huggingface_hub and datasets raise many types for "not there"
        name = type(e).__name__
        if offline() or name in ("LocalEntryNotFoundError", "OfflineModeIsEnabled"):
            raise _unavailable(c, where, path_key, "the hub is offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)") \
                from None
        if isinstance(e, ValueError) or name in ("DatasetNotFoundError", "RepositoryNotFoundError", "GatedRepoError"):
            raise DatasetError(f"{where}: {c.repo}: {_first_line(e)}") from None
        raise
