"""NeMo RL's dataset registry by name: which hub copy each name reads and which of NeMo RL's row formats
(``rlplane.data.registry_formats``) makes its rows.

Every text entry of NeMo RL's ``response_datasets`` registry and of its eval datasets is here with the same hub
id, subset and split, the same columns and the same answer extraction (gsm8k keeps what follows ``####``,
OpenMathInstruct-2 reads ``expected_answer``, DAPO-Math its ``reward_model.ground_truth``, ...). A row comes out
as NeMo RL builds it, ``{"messages": [...], ...}``, plus ``problem`` and ``answer``: ``messages[0]`` and
``messages[1]``, which is what NeMo RL's ``math_hf_data_processor`` reads as problem and ground truth.

The table is pure: :func:`registry_rows` reads through a ``load`` function handed in (``rlplane.data.hub``
reads the Hugging Face cache; tests hand in tables). Multimodal entries and NeMo-Gym's are named, to be refused
in one line.
"""

from __future__ import annotations

import difflib
import gzip
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rlplane.data import registry_formats as F
from rlplane.data.errors import DatasetError

SIMPLE_EVALS = "https://openaipublic.blob.core.windows.net/simple-evals"
MMLU_LANGUAGES = ("AR-XY", "BN-BD", "DE-DE", "ES-LA", "FR-FR", "HI-IN", "ID-ID", "IT-IT", "JA-JP", "KO-KR", "PT-BR",
                  "ZH-CN", "SW-KE", "YO-NG")
# NeMo RL's entries that need images, video or audio: a text model cannot train on them.
MULTIMODAL = ("audiomcq", "avqa", "clevr-cogent", "daily-omni", "geometry3k", "mmpr-tiny", "refcoco", "intent-train",
              "intent-bench", "mmau", "TwinkStart/MMAU")
# NeMo-Gym rows name NeMo-Gym's own environments and servers.
GYM = ("NemoGymDataset",)
# NeMo RL's plain-file entry: rlplane reads its files as `jsonl` or `hf` (config/nemo_data.py).
RESPONSE_DATASET = "ResponseDataset"


@dataclass(frozen=True)
class HubCopy:
    """One ``datasets.load_dataset`` read: a hub id (or a file URL) with its subset and split, or one ``file``
    of the hub repo (read as gzipped JSON lines)."""

    repo: str
    subset: str | None = None
    split: str = "train"
    file: str | None = None

    @property
    def is_url(self) -> bool:
        return self.repo.startswith(("https://", "http://"))


@dataclass(frozen=True)
class Source:
    """What a config names: an entry, its options (NeMo RL's keyword arguments, defaults filled in) and, where
    given, a local copy to read instead of the hub's (``path``)."""

    name: str
    options: Mapping[str, Any]
    path: str | None = None


@dataclass(frozen=True)
class Entry:
    """One registry name. ``copies(options)``: the hub reads; ``rows(hub rows, options)``: NeMo RL's rows."""

    name: str
    defaults: Mapping[str, Any]  # every option with NeMo RL's default; others are errors
    copies: Callable[[Mapping[str, Any]], list[HubCopy]]
    rows: Callable[[Iterable[dict], Mapping[str, Any]], Iterable[dict]]
    reads: str  # one line for docs/nemo.md: what NeMo RL reads
    needs_path: bool = False  # a local-file entry: `path` is its data file, there is no hub copy
    split_validation_size: float = 0.0  # NeMo RL's default hold-out for validation
    splits: tuple[str, ...] = field(default=())  # the splits it accepts (empty: any)


def _one(repo: str, subset: str | None = None, split: str | None = None):
    """One read of ``repo``: its fixed ``subset`` (None: none), ``split`` fixed or the configured one."""
    return lambda o: [HubCopy(repo, subset, split or o.get("split", "train"))]


def _local(_opts):
    return []  # a local-file entry reads `path` only


_ENTRIES: list[Entry] = [
    Entry("OpenMathInstruct-2", {"split": "train_1M", "output_key": "expected_answer"},
          _one("nvidia/OpenMathInstruct-2"), F.omi2_rows, "`problem` -> `output_key` (`expected_answer`)",
          split_validation_size=0.05, splits=("train", "train_1M", "train_2M", "train_5M")),
    Entry("DAPOMath17K", {}, _one("BytedTsinghua-SIA/DAPO-Math-17k", split="train"), F.dapo_rows,
          "`prompt[0].content` -> `reward_model.ground_truth`"),
    Entry("DAPOMathAIME2024", {}, _one("BytedTsinghua-SIA/AIME-2024", split="train"), F.dapo_rows,
          "`prompt[0].content` -> `reward_model.ground_truth`"),
    Entry("DeepScaler", {}, _one("agentica-org/DeepScaleR-Preview-Dataset", split="train"),
          F.columns_rows("problem", "answer"), "`problem` -> `answer`"),
    *[Entry(n, {"subset": "main", "split": "train", "extract_answer": True},
            lambda o: [HubCopy("openai/gsm8k", o["subset"] or "main", o["split"])], F.gsm8k_rows,
            "`question` -> what follows `####` in `answer` (`extract_answer: false`: all of it)")
      for n in ("GSM8K", "gsm8k")],
    Entry("AIME2024", {}, _one("HuggingFaceH4/aime_2024", split="train"), F.columns_rows("problem", "answer"),
          "`problem` -> `answer`"),
    Entry("AIME2025", {}, lambda o: [HubCopy("opencompass/AIME2025", s, "test") for s in ("AIME2025-I", "AIME2025-II")],
          F.columns_rows("question", "answer"), "`question` -> `answer`, subsets AIME2025-I then AIME2025-II"),
    Entry("AIME2026", {}, _one("MathArena/aime_2026", split="train"), F.columns_rows("problem", "answer"),
          "`problem` -> `answer` (an integer, as text)"),
    Entry("NuminaMath-1.5", {"split": "train", "verifiable_only": True, "require_valid": True},
          _one("AI-MO/NuminaMath-1.5"), F.numina_rows,
          "`problem` -> `answer`; rows without a checkable answer dropped (`verifiable_only`), and rows not marked "
          "valid (`require_valid`)"),
    Entry("OpenR1-Math-220k", {"subset": "default", "split": "train"},
          lambda o: [HubCopy("open-r1/OpenR1-Math-220k", o["subset"] or "default", o["split"])],
          F.columns_rows("problem", "answer"), "`problem` -> `answer`"),
    Entry("squad", {"split": "train"}, _one("rajpurkar/squad"), F.squad_rows,
          "system `context`, user `question`, assistant `answers.text[0]`"),
    Entry("open_assistant", {},
          lambda o: [HubCopy("OpenAssistant/oasst1", file="2023-04-12_oasst_all.trees.jsonl.gz")], F.oasst_rows,
          "every root-to-leaf thread of the message trees after NeMo RL's system prompt",
          split_validation_size=0.05),
    Entry("tulu3_sft_mixture", {"max_samples": None, "seed": 42},
          _one("allenai/tulu-3-sft-mixture", split="train"), F.messages_rows("tulu3_sft_mixture"),
          "`messages` (ending with an assistant turn); `max_samples` drawn after a seeded shuffle",
          split_validation_size=0.05),
    Entry("HelpSteer3", {"split": "train"}, _one("nvidia/HelpSteer3", subset="preference"), F.helpsteer3_rows,
          "`context`, then the preferred of `response1`/`response2` by `overall_preference`"),
    Entry("Nemotron-Cascade-2-SFT-Math", {"split": "train", "max_samples": None, "seed": 42},
          _one("nvidia/Nemotron-Cascade-2-SFT-Data", subset="math"), F.messages_rows("Nemotron-Cascade-2-SFT-Math"),
          "`messages` of the `math` subset; `max_samples` drawn after a seeded shuffle", split_validation_size=0.05),
    Entry("openai_format", {"chat_key": "messages", "system_key": None, "system_prompt": None, "tool_key": "tools",
                            "use_preserving_dataset": False},
          _local, F.openai_format_rows, "a local JSONL of `chat_key` message lists (`path`), optional system message",
          needs_path=True),
    Entry("general-conversation-jsonl", {"media_data_dir": None}, _local, F.conversations_rows,
          "a local file of `conversations` (`from`/`value`) rows (`path`); text only", needs_path=True),
    Entry("arrow_text", {"split": "train", "subset": None, "text_key": "text", "characters_per_sample": None},
          _local, F.arrow_text_rows, "`text_key` of a file, glob or hub id (`path`) as one assistant message",
          needs_path=True),
    # NeMo RL's eval datasets (`load_eval_dataset`)
    Entry("math", {}, lambda o: [HubCopy(f"{SIMPLE_EVALS}/math_test.csv")], F.math_eval_rows,
          "simple-evals `math_test.csv`: `Question` -> `Answer`"),
    Entry("math500", {}, lambda o: [HubCopy(f"{SIMPLE_EVALS}/math_500_test.csv")], F.math_eval_rows,
          "simple-evals `math_500_test.csv`: `Question` -> `Answer`"),
    *[Entry(n, {"seed": 42}, _one("Idavidrein/gpqa", subset=f"gpqa_{v}", split="train"), F.gpqa_rows,
            "`Question` with its four answers shuffled (seeded) as A-D -> the correct one's letter")
      for n, v in (("gpqa", "main"), ("gpqa_diamond", "diamond"))],
    Entry("mmlu", {}, lambda o: [HubCopy(f"{SIMPLE_EVALS}/mmlu.csv")], F.mmlu_rows,
          "simple-evals `mmlu.csv`: `Question`, options `A`-`D` -> `Answer`"),
    *[Entry(f"mmlu_{lang}", {}, lambda o, lang=lang: [HubCopy(f"{SIMPLE_EVALS}/mmlu_{lang}.csv")], F.mmlu_rows,
            f"simple-evals `mmlu_{lang}.csv`: `Question`, options `A`-`D` -> `Answer`") for lang in MMLU_LANGUAGES],
    Entry("mmlu_pro", {}, _one("TIGER-Lab/MMLU-Pro", split="test"), F.mmlu_pro_rows,
          "`question`, `options` as A, B, ... -> `answer`"),
]
ENTRIES: dict[str, Entry] = {e.name: e for e in _ENTRIES}


def known_names() -> list[str]:
    return list(ENTRIES)


def entry(name: str, key: str) -> Entry:
    """The entry ``name``, or a one-line error naming ``key`` (multimodal and NeMo-Gym names say why)."""
    if name in MULTIMODAL:
        raise DatasetError(f"{key} = {name!r}: a multimodal dataset of NeMo RL's (images, video or audio); rlplane "
                           "trains text-only language models: pick a text dataset")
    if name in GYM:
        raise DatasetError(f"{key} = {name!r}: NeMo-Gym's rows run in NeMo-Gym's environments, which rlplane does "
                           "not have; use a registry dataset or a JSONL file (data.dataset=jsonl)")
    if name not in ENTRIES:
        close = difflib.get_close_matches(str(name), ENTRIES, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        raise DatasetError(f"{key} = {name!r}: not a NeMo RL dataset name; {hint}known: {', '.join(ENTRIES)} (or a "
                           "hub id with data.dataset=hf data.train.path=ID)")
    return ENTRIES[name]


# Options that are not text, by name (every other option is text, or null where its default is): NeMo RL's types.
_FLAGS = ("extract_answer", "verifiable_only", "require_valid", "use_preserving_dataset")
_COUNTS = ("max_samples", "characters_per_sample")  # a positive number, or null for all


def _option_problem(name: str, value: Any, default: Any) -> str | None:
    """What ``value`` for option ``name`` should be instead (None: it is fine)."""
    if name in _FLAGS:
        return None if isinstance(value, bool) else "true or false"
    if name in _COUNTS:
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)
        return None if ok else "a whole number of at least 1, or null"
    if name == "seed":
        return None if isinstance(value, int) and not isinstance(value, bool) else "a whole number"
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "true or false"
    if isinstance(default, int):
        return None if isinstance(value, int) and not isinstance(value, bool) else "a whole number"
    return None if isinstance(value, str) or (value is None and default is None) else "text"


def resolve_options(e: Entry, given: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``given`` over ``e``'s defaults; an option it does not take, or a split it does not have, is an error.
    ``key`` is the config section (``data.train``)."""
    unknown = sorted(set(given) - set(e.defaults))
    if unknown:
        takes = ", ".join(e.defaults) or "none"
        raise DatasetError(f"{key}.options.{unknown[0]}: not an option of {e.name} (its options: {takes}); remove it")
    for name, value in given.items():
        if (want := _option_problem(name, value, e.defaults[name])) is not None:
            raise DatasetError(f"{key}.options.{name} = {value!r}: {e.name}'s {name} is {want} (NeMo RL's default: "
                               f"{e.defaults[name]!r}); set {want}")
    opts = {**e.defaults, **given}
    if e.splits and opts.get("split") not in e.splits:
        raise DatasetError(f"{key}.split = {opts.get('split')!r}: {e.name} has the splits {', '.join(e.splits)}; "
                           "set one of them")
    return opts


def too_many_rows(key: str, name: str, what: str, max_rows: int) -> DatasetError:
    return DatasetError(f"{key}.name = {name!r}: {what} holds more than {max_rows:,} rows, over data.max_rows = "
                        f"{max_rows:,} (every row is tokenized and held at start-up); raise data.max_rows (null: no "
                        f"limit), or set {key}.path to a copy cut to the rows the run will use")


def registry_rows(source: Source, load: Callable[[HubCopy], Iterable[dict]], key: str, *,
                  max_rows: int | None = None) -> list[dict]:
    """NeMo RL's rows of ``source`` (``key``: its config section, ``data.train``): each hub copy read with ``load``
    (a local copy: ``load`` reads ``source.path``), then formatted; ``problem``/``answer`` added from
    ``messages[0]``/``messages[1]``. More than ``max_rows`` (``data.max_rows``) rows read or made is an error,
    said before a read table is turned into rows (``load`` gives a table with its length, or a list)."""
    e = entry(source.name, f"{key}.name")
    opts = resolve_options(e, source.options, key)
    if e.needs_path and not source.path:
        raise DatasetError(f"{key}: {e.name} reads a local file; set {key}.path=FILE")
    if e.needs_path:
        copies = [HubCopy(source.path, opts.get("subset"), opts.get("split", "train"))]
    else:  # a local copy stands where the hub id (or URL) was, read with the same subset and split
        copies = [replace(c, repo=source.path) if source.path else c for c in e.copies(opts)]
    tables = [load(c) for c in copies]
    repos = ", ".join(dict.fromkeys(c.repo for c in copies))
    if max_rows is not None and sum(len(t) for t in tables) > max_rows:
        raise too_many_rows(key, e.name, repos, max_rows)
    out = []
    try:
        for row in e.rows((row for t in tables for row in t), opts):
            messages = row["messages"]
            if len(messages) >= 2:
                row = {**row, "problem": messages[0]["content"], "answer": messages[1]["content"]}
            out.append(row)
            if max_rows is not None and len(out) > max_rows:  # one hub row can make several (OpenAssistant's threads)
                raise too_many_rows(key, e.name, f"the rows made of {repos}", max_rows)
    except (KeyError, TypeError, IndexError) as err:  # a copy whose columns are not the dataset's
        raise _not_its_layout(key, e, repos, tables, err) from None
    return out


def _not_its_layout(key: str, e: Entry, repos: str, tables: list, err: Exception) -> DatasetError:
    first = next((t for t in tables if len(t)), None)
    if hasattr(first, "column_names"):
        columns = list(first.column_names)
    else:
        columns = list(first[0]) if first and isinstance(first[0], Mapping) else []
    what = f"no column {err.args[0]!r}" if isinstance(err, KeyError) else f"a value shaped otherwise ({err})"
    return DatasetError(f"{key}.name = {e.name!r}: {repos}: {what} (its columns: {', '.join(columns) or 'none'}); "
                        f"{e.name} reads {e.reads.replace('`', '')}: give {key}.path a copy with those columns")


def read_gzip_jsonl(path: str, max_rows: int | None = None) -> list[dict]:
    """The objects of a gzipped JSON-lines file (OpenAssistant's trees); past ``max_rows`` objects it reads one
    more and stops (the caller says the file is over the limit)."""
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
                if max_rows is not None and len(out) > max_rows:
                    break
    return out
