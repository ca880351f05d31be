"""Atomic, durable checkpoints with best-K retention, and the loading of their weights.

Written into ``tmp_step_N/``, fsynced, renamed to ``step_N/``; a re-save parks the old one as ``old_step_N``
and a pruned one becomes ``pruned_step_N`` before deletion, so a kill leaves only debris that
:meth:`CheckpointManager.repair` cleans. Retention: the best ``keep_top_k`` by metric plus the latest.

``step_N/``: ``training_info.json`` (step, consumed prompts, metrics), ``config.yaml``, ``policy/weights/``
(HF safetensors + tokenizer), ``policy/optimizer.pt``, ``dataloader.pt``, ``rng.pt``, and for async GRPO
``replay_buffer.pt`` (buffer groups, collector loader, pending prompts, sampler RNG).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from rlplane.utils.kill_points import kill_point

_STEP = re.compile(r"^step_(\d+)$")
_OLD_STEP = re.compile(r"^old_step_(\d+)$")
_PRUNED = "pruned_"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """An unusable checkpoint (damaged, incomplete, other model shape); one line naming it and the fix."""


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` and ``root``: a rename is durable only once its target is."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_failure(e: BaseException, where: Path) -> str | None:
    """Why writing a checkpoint into ``where`` failed, when the disk failed it (None: another error).
    A worker's error arrives wrapped (Ray: ``cause``); torch.save on a full disk says only "unexpected pos"."""
    cause = getattr(e, "cause", None) or e
    if isinstance(cause, OSError):
        return cause.strerror or type(cause).__name__
    if "No space left on device" in str(cause):
        return "No space left on device"
    try:
        full = shutil.disk_usage(where).free < 2**20
    except OSError:
        return None
    return "No space left on device" if full else None


class CheckpointManager:
    def __init__(self, checkpoint_dir: str | os.PathLike, keep_top_k: int | None, metric_name: str,
                 higher_is_better: bool):
        # Absolute: workers (maybe on other nodes or in another cwd) write here.
        self.dir = Path(checkpoint_dir).expanduser().absolute()
        self.keep_top_k = keep_top_k
        self.metric_name = metric_name
        self.higher_is_better = higher_is_better

    def _complete(self) -> dict[int, Path]:
        """Step -> directory of every complete checkpoint (``old_step_N`` where a re-save was cut short)."""
        if not self.dir.is_dir():
            return {}
        found: dict[int, Path] = {}
        olds: dict[int, Path] = {}
        for p in self.dir.iterdir():
            if not p.is_dir():
                continue
            if m := _STEP.match(p.name):
                found[int(m.group(1))] = p
            elif m := _OLD_STEP.match(p.name):
                olds[int(m.group(1))] = p
        return {**olds, **found}

    def steps(self) -> list[int]:
        return sorted(self._complete())

    def path(self, step: int) -> Path:
        return self._complete().get(step, self.dir / f"step_{step}")

    def latest(self) -> Path | None:
        complete = self._complete()
        return complete[max(complete)] if complete else None

    def best(self) -> Path | None:
        ranked = self._ranked()
        return self.path(ranked[0]) if ranked else self.latest()

    def save(self, step: int, training_info: dict, write: Callable[[Path], None]) -> Path:
        """Create ``tmp_step_N``, let ``write`` fill it, fsync it, then rename it into place and prune."""
        tmp = self.dir / f"tmp_step_{step}"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
            write(tmp)
            (tmp / "training_info.json").write_text(json.dumps(training_info, indent=2, sort_keys=True))
            fsync_tree(tmp)
        except Exception as e:  # a full disk, a quota, a mount gone read-only: one line, no half checkpoint
            why = write_failure(e, self.dir)  # before the partial files go (they may be what filled the disk)
            shutil.rmtree(tmp, ignore_errors=True)
            if why is None:
                raise
            raise CheckpointError(f"checkpoint {tmp}: cannot write it ({why}); free space "
                                  "there or set checkpointing.checkpoint_dir elsewhere, then resume") from None
        kill_point("checkpoint_rename")
        final = self.dir / f"step_{step}"
        if final.exists():
            old = self.dir / f"old_step_{step}"
            if old.exists():  # a leftover of an earlier cut re-save; `final` is whole, so it goes
                shutil.rmtree(old)
            final.rename(old)
            fsync_dir(self.dir)
            tmp.rename(final)  # a crash before this line leaves old_step_N: repair() restores it
            fsync_dir(self.dir)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
        fsync_dir(self.dir)
        self._prune()
        return final

    def load_info(self, path: Path) -> dict:
        try:
            info = read_json_file(path / "training_info.json")
        except (OSError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint {path}: training_info.json is missing or damaged "
                f"({e}); delete {path} to resume from the checkpoint before it"
            ) from None
        if not isinstance(info, dict) or not isinstance(info.get("step"), int):
            raise CheckpointError(f"checkpoint {path}: training_info.json has no integer 'step'; delete {path} "
                                  "to resume from the checkpoint before it")
        return info

    def repair(self) -> list[str]:
        """Undo a crash mid-save: restore a cut-short ``old_step_N``, remove ``tmp_*``/``old_*``/``pruned_*`` debris.

        Returns one phrase per directory handled."""
        done = []
        if not self.dir.is_dir():
            return done
        for p in sorted(self.dir.iterdir()):
            if not p.is_dir():
                continue
            m = _OLD_STEP.match(p.name)
            if m and not (self.dir / f"step_{m.group(1)}").exists():
                p.rename(self.dir / f"step_{m.group(1)}")
                done.append(f"restored {p.name} (a re-save cut between its renames)")
            elif m or p.name.startswith(("tmp_step_", _PRUNED)):
                shutil.rmtree(p)
                done.append(f"removed incomplete {p.name}")
        if done:
            fsync_dir(self.dir)
        return done

    def _metric(self, step: int) -> float | None:
        info = self.load_info(self.path(step))
        v = info.get("metrics", {}).get(self.metric_name)
        return None if v is None else float(v)

    def _ranked(self) -> list[int]:
        scored = [(s, m) for s in self.steps() if (m := self._metric(s)) is not None]
        sign = -1.0 if self.higher_is_better else 1.0
        # Best first; ties broken by recency (newer first).
        return [s for s, m in sorted(scored, key=lambda sm: (sign * sm[1], -sm[0]))]

    def _prune(self) -> None:
        if self.keep_top_k is None:
            return
        steps = self.steps()
        if len(steps) <= self.keep_top_k:
            return
        keep = set(self._ranked()[: self.keep_top_k]) | {steps[-1]}
        if len(keep) == 1:  # no metric recorded yet: keep the most recent K
            keep = set(steps[-self.keep_top_k :])
        for s in steps:
            if s not in keep:
                path = self.path(s)
                aside = path.with_name(_PRUNED + path.name)
                path.rename(aside)  # atomic: from here on it is no checkpoint, whatever the delete leaves
                kill_point("checkpoint_prune")
                shutil.rmtree(aside)


# ---- sizes against headers, checked before a file is read
MAX_JSON_BYTES = 16 << 20  # training_info.json, a shard index: rlplane writes a few KB
MAX_SAFETENSORS_HEADER_BYTES = 100_000_000  # safetensors' own bound on its JSON header


def _damaged(path, what: str) -> CheckpointError:
    return CheckpointError(f"checkpoint file {path}: {what}; delete the checkpoint it belongs to (resume then starts "
                           "from the one before) or restore it")


def read_json_file(path: Path) -> object:
    """A checkpoint's JSON file, its size checked first (``OSError`` / ``ValueError`` as ``json.load``'s)."""
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise ValueError(f"{size:,} bytes, over MAX_JSON_BYTES = {MAX_JSON_BYTES:,}")
    return json.loads(path.read_bytes())


def check_safetensors_sizes(path: Path) -> None:
    """The header's length and its tensors' offsets against the file's size: a truncated or padded file, or a
    header that claims more than the file holds, is one line before the tensors are read."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        header_bytes = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < header_bytes <= min(size - 8, MAX_SAFETENSORS_HEADER_BYTES):
            raise _damaged(path, f"its header claims {header_bytes:,} bytes and the file holds {size:,} (a truncated "
                                 "or damaged safetensors file)")
        try:
            header = json.loads(f.read(header_bytes))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
            raise _damaged(path, f"its header is not safetensors' ({type(e).__name__})") from None
    if 8 + header_bytes + end != size:
        raise _damaged(path, f"its header places tensors up to byte {8 + header_bytes + end:,} and the file holds "
                             f"{size:,} (truncated or padded)")


def check_zip_sizes(path) -> None:
    """A ``torch.save`` file is a zip of stored records: each record's declared size must be the bytes it takes in
    the file (no compression, which could expand without bound) and together fit in the file. Read from the zip's
    directory before torch allocates a record; a file that is no zip is left to torch's own error."""
    import zipfile

    size = os.path.getsize(path)
    try:
        with zipfile.ZipFile(path) as z:
            records = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return
    packed = next((r for r in records if r.compress_type != zipfile.ZIP_STORED or r.file_size != r.compress_size),
                  None)
    if packed is not None:
        raise _damaged(path, f"record {packed.filename!r} declares {packed.file_size:,} bytes from "
                             f"{packed.compress_size:,} stored (torch.save writes records as they are)")
    declared = sum(r.file_size for r in records)
    if declared > size:
        raise _damaged(path, f"its records declare {declared:,} bytes and the file holds {size:,}")


# ---- weights
def latest_checkpoint(checkpoint_dir: str | os.PathLike) -> Path | None:
    """The latest complete ``step_N`` in ``checkpoint_dir`` (None if none), read without changing anything."""
    return CheckpointManager(checkpoint_dir, None, "val:accuracy", True).latest()


def weight_files(weights_dir: str | os.PathLike) -> list[Path]:
    """The safetensors files of an HF weights directory: the shards its index names, or ``model.safetensors``."""
    d = Path(weights_dir)
    index = d / INDEX_FILE
    if index.is_file():
        try:
            weight_map = read_json_file(index)["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"weights {d}: {INDEX_FILE} is damaged "
                                  f"({e!r}); re-save or restore the model") from None
        files = [d / n for n in names]
    elif (d / SINGLE_FILE).is_file():
        files = [d / SINGLE_FILE]
    else:
        raise CheckpointError(f"weights {d}: neither {SINGLE_FILE} nor {INDEX_FILE} is there; the checkpoint is "
                              "incomplete: delete it, or point at a complete one")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(f"weights {d}: shard {missing[0]} named in {INDEX_FILE} "
                              "is missing; restore it or delete the checkpoint")
    return files


def weight_shapes(weights_dir: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from the safetensors headers alone; a damaged file raises :class:`CheckpointError`."""
    from safetensors import SafetensorError, safe_open

    shapes = {}
    for f in weight_files(weights_dir):
        check_safetensors_sizes(f)
        try:
            with safe_open(str(f), "pt") as st:
                for k in st.keys():
                    shapes[k] = tuple(st.get_slice(k).get_shape())
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"weights {f}: damaged or truncated safetensors file ({e}); delete the checkpoint "
                                  "it belongs to (resume then starts from the one before) or restore it") from None
    return shapes


def load_weights(weights_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of an HF weights directory, single-file or sharded."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in weight_files(weights_dir):
        check_safetensors_sizes(f)
        try:
            out.update(load_file(str(f)))
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"weights {f}: damaged or truncated safetensors file ({e}); delete the checkpoint "
                                  "it belongs to (resume then starts from the one before) or restore it") from None
    return out


def check_weights_fit(model: torch.nn.Module, weights_dir: str | os.PathLike, fix: str) -> None:
    """Raise :class:`CheckpointError` unless ``weights_dir`` has ``model``'s names and shapes (a tied
    ``lm_head`` may be missing); ``fix`` ends the message."""
    check_shapes_fit({k: tuple(v.shape) for k, v in model.state_dict().items()}, weights_dir, fix)


def check_shapes_fit(expected: dict[str, tuple[int, ...]], weights_dir: str | os.PathLike, fix: str) -> None:
    """:func:`check_weights_fit` against a model's weight names and shapes (``expected``)."""
    saved = weight_shapes(weights_dir)
    for k, shape in expected.items():
        if k in saved and saved[k] != shape:
            raise CheckpointError(
                f"weights {weights_dir}: {k} is {list(saved[k])} there but {list(shape)} in the configured model "
                f"(a different model shape); {fix}"
            )
    missing = [k for k in expected if k not in saved and "lm_head" not in k]
    unknown = [k for k in saved if k not in expected]
    if missing or unknown:
        what = f"lacks {missing[0]}" if missing else f"has {unknown[0]}, which the configured model has not"
        raise CheckpointError(f"weights {weights_dir}: {what} (a different model); {fix}")


def load_torch_state(path: str | os.PathLike):
    """``torch.load(path, weights_only=True)`` with a one-line error for a missing or damaged file."""
    try:
        check_zip_sizes(path)
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path} is missing; the checkpoint is incomplete: delete it "
                              "(resume then starts from the one before)") from None
    except CheckpointError:
        raise
    except Exception as e:  # torch raises RuntimeError, UnpicklingError, EOFError, ... for a damaged file
        # torch's first sentence is the useful part.
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        reason = f"{type(e).__name__}: {text.split('. ')[0]}" if text else type(e).__name__
        raise CheckpointError(f"checkpoint file {path} is damaged ({reason}); delete the checkpoint it belongs to "
                              "(resume then starts from the one before)") from None
