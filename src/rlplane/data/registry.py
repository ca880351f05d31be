"""NeMo RL's dataset registry by name: which hub copy each name reads and how a hub row becomes a prompt row.

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

import gzip
import json
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rlplane.data.errors import DatasetError
from rlplane.data.splits import shuffled_indices

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


def _chat(user: str, assistant: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


def _columns(problem: str, answer: str) -> Callable[[Iterable[dict], Mapping[str, Any]], Iterable[dict]]:
    """Rows whose problem and answer are two columns (an integer answer as its text, as NeMo RL casts it)."""
    return lambda rows, _opts: ({"messages": _chat(r[problem], str(r[answer]))} for r in rows)


def gsm8k_answer(text: str) -> str | None:
    """What follows ``####`` in a GSM8K solution (NeMo RL's ``_extract_hash_answer``); None without one."""
    return text.split("####")[1].strip() if "####" in text else None


def _gsm8k(rows, opts):
    for r in rows:
        yield {"messages": _chat(r["question"], gsm8k_answer(r["answer"]) if opts["extract_answer"] else r["answer"])}


def _dapo(rows, _opts):
    for r in rows:
        yield {"messages": _chat(r["prompt"][0]["content"], r["reward_model"]["ground_truth"])}


def _omi2(rows, opts):
    for r in rows:
        yield {"messages": _chat(r["problem"], r[opts["output_key"]])}


NON_VERIFIABLE_ANSWERS = frozenset({"proof", "notfound"})


def _numina(rows, opts):
    """NuminaMath-1.5 keeps rows with a checkable answer (not ``proof``/``notfound``, not a proof question) and,
    with ``require_valid``, rows marked valid in both problem and solution."""
    for r in rows:
        answer = (r.get("answer") or "").strip()
        verifiable = (answer and answer.lower() not in NON_VERIFIABLE_ANSWERS
                      and (r.get("question_type") or "").strip().lower() != "proof")
        if opts["verifiable_only"] and not verifiable:
            continue
        if opts["require_valid"] and not (r.get("problem_is_valid") == "Yes" == r.get("solution_is_valid")):
            continue
        yield {"messages": _chat(r["problem"], r["answer"])}


def _squad(rows, _opts):
    for r in rows:
        context = {"role": "system", "content": r["context"]}
        yield {"messages": [context, *_chat(r["question"], r["answers"]["text"][0])]}


def _ends_with_assistant(messages: list, name: str) -> list:
    if not messages or messages[-1]["role"] != "assistant":
        raise DatasetError(f"dataset {name}: a conversation does not end with an assistant message "
                           f"(last role: {messages[-1]['role'] if messages else 'none'}); fix the row")
    return messages


def _sampled(rows: Iterable[dict], opts: Mapping[str, Any]) -> list[dict]:
    """``max_samples`` rows drawn as NeMo RL draws them: ``shuffle(seed)`` then the first N."""
    rows = list(rows)
    n = opts.get("max_samples")
    if n is None or n <= 0:
        return rows
    order = shuffled_indices(len(rows), opts["seed"])
    return [rows[i] for i in order[: min(n, len(rows))]]


def _messages_rows(name: str):
    def rows(hub_rows, opts):
        for r in _sampled(hub_rows, opts):
            yield {"messages": _ends_with_assistant(list(r["messages"]), name)}
    return rows


def _helpsteer3(rows, _opts):
    """The preferred response (response1 when overall_preference <= 0, else response2) after the context."""
    for r in rows:
        chosen = r["response1"] if r["overall_preference"] <= 0 else r["response2"]
        context = [{"role": "user", "content": r["context"]}] if isinstance(r["context"], str) else list(r["context"])
        response = [{"role": "assistant", "content": chosen}]
        yield {"messages": [*context, *response], "context": context, "response": response}


OASST_SYSTEM_PROMPT = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                       "helpful, detailed, and polite answers to the user's questions.\n\n")
OASST_ROLES = {"prompter": "user", "assistant": "assistant"}


def oasst_threads(node: dict) -> list[list[dict[str, str]]]:
    """Every path from ``node`` down to a leaf of an OpenAssistant message tree, as messages."""
    turn = {"role": OASST_ROLES[node["role"]], "content": node["text"]}
    below = [thread for reply in node.get("replies", []) for thread in oasst_threads(reply)]
    return [[turn, *thread] for thread in below] or [[turn]]


def _oasst(trees, _opts):
    """OpenAssistant trees: one conversation per root-to-leaf path after NeMo RL's system prompt; a lone prompt
    (no reply) is dropped."""
    for tree in trees:
        root = tree.get("prompt")
        if root is None:
            continue
        for thread in oasst_threads(root):
            if len(thread) >= 2:
                yield {"messages": [{"role": "system", "content": OASST_SYSTEM_PROMPT}, *thread]}


def _openai_format(rows, opts):
    for r in rows:
        messages = list(r[opts["chat_key"]])
        if opts["system_key"] is not None and opts["system_key"] in r:
            messages = [{"role": "system", "content": r[opts["system_key"]]}, *messages]
        elif opts["system_prompt"]:
            messages = [{"role": "system", "content": opts["system_prompt"]}, *messages]
        row = {"messages": _ends_with_assistant(messages, "openai_format")}
        if opts["tool_key"] and opts["tool_key"] in r:
            row["tools"] = r[opts["tool_key"]]
        yield row


MEDIA_TAGS = ("<image>", "<video>", "<audio>", "<video-audio>", "<speech>", "<speeches>", "<sound>", "<audios>",
              "<images>", "<videos>")
CONVERSATION_ROLES = {"user": "user", "assistant": "assistant", "human": "user", "gpt": "assistant",
                      "agent": "assistant"}


def _conversations(rows, _opts):
    """``{"conversations": [{"from", "value"}]}`` rows (general-conversation-jsonl); text only."""
    for i, r in enumerate(rows, start=1):
        messages = []
        for m in r.get("conversations", []):
            if any(tag in m["value"] for tag in MEDIA_TAGS):
                raise DatasetError(f"dataset general-conversation-jsonl, row {i}: holds a media tag "
                                   f"({next(t for t in MEDIA_TAGS if t in m['value'])}); rlplane trains text-only "
                                   "models: drop such rows")
            if m["from"] not in CONVERSATION_ROLES:
                raise DatasetError(f"dataset general-conversation-jsonl, row {i}: unknown role {m['from']!r}; use "
                                   f"one of {', '.join(CONVERSATION_ROLES)}")
            messages.append({"role": CONVERSATION_ROLES[m["from"]], "content": m["value"]})
        yield {"messages": messages}


def _arrow_text(rows, opts):
    """Raw text as one assistant message; with ``characters_per_sample`` consecutive rows joined by newlines until
    they reach that many characters (NeMo RL's packing for cross-tokenizer distillation)."""
    key, per = opts["text_key"], opts["characters_per_sample"]
    texts = [r[key] for r in rows if isinstance(r[key], str) and r[key]]
    if not per or per <= 0:
        yield from ({"messages": [{"role": "assistant", "content": t}], "text": t} for t in texts)
        return
    buf: list[str] = []
    for t in texts:
        buf.append(t)
        if sum(map(len, buf)) >= per:
            yield {"messages": [{"role": "assistant", "content": "\n".join(buf)}], "text": "\n".join(buf)}
            buf = []
    if buf:
        yield {"messages": [{"role": "assistant", "content": "\n".join(buf)}], "text": "\n".join(buf)}


def multichoice_problem(question: str, options: Mapping[str, str | None]) -> str:
    """NeMo RL's multiple-choice prompt body (``_construct_multichoice_prompt`` without its prompt file)."""
    lines = "\n".join(f"{letter}) {text}" for letter, text in options.items() if text is not None)
    return f"Question: {question}\nOptions:\n{lines}"


def _multichoice_row(question: str, options: dict, answer: str, subject: str | None = None) -> dict:
    row = {"messages": _chat(multichoice_problem(question, options), answer), "question": question,
           "options": options, "answer": answer}
    return {**row, "subject": subject} if subject is not None else row


def _mmlu(rows, _opts):
    for r in rows:
        yield _multichoice_row(r["Question"], {k: r[k] for k in "ABCD"}, r["Answer"], r["Subject"])


def _mmlu_pro(rows, _opts):
    for r in rows:
        yield _multichoice_row(r["question"], {chr(ord("A") + i): o for i, o in enumerate(r["options"])}, r["answer"],
                               r["category"])


def _gpqa(rows, opts):
    """The four choices in a shuffled order, the answer the correct one's letter. NeMo RL shuffles with an
    unseeded ``random.Random()``; here ``seed`` makes the order reproducible."""
    rng = random.Random(opts["seed"])
    for r in rows:
        choices = [r["Correct Answer"], r["Incorrect Answer 1"], r["Incorrect Answer 2"], r["Incorrect Answer 3"]]
        choices = [choices[i] for i in rng.sample(range(4), 4)]
        yield _multichoice_row(r["Question"], dict(zip("ABCD", choices)), "ABCD"[choices.index(r["Correct Answer"])])


def _math_eval(rows, _opts):
    for r in rows:
        yield {"messages": _chat(r["Question"], str(r["Answer"])), "expected_answer": str(r["Answer"])}


def _one(repo: str, subset: str | None = None, split: str | None = None):
    """One read of ``repo``: its fixed ``subset`` (None: none), ``split`` fixed or the configured one."""
    return lambda o: [HubCopy(repo, subset, split or o.get("split", "train"))]


def _local(_opts):
    return []  # a local-file entry reads `path` only


_ENTRIES: list[Entry] = [
    Entry("OpenMathInstruct-2", {"split": "train_1M", "output_key": "expected_answer"},
          _one("nvidia/OpenMathInstruct-2"), _omi2, "`problem` -> `output_key` (`expected_answer`)",
          split_validation_size=0.05, splits=("train", "train_1M", "train_2M", "train_5M")),
    Entry("DAPOMath17K", {}, _one("BytedTsinghua-SIA/DAPO-Math-17k", split="train"), _dapo,
          "`prompt[0].content` -> `reward_model.ground_truth`"),
    Entry("DAPOMathAIME2024", {}, _one("BytedTsinghua-SIA/AIME-2024", split="train"), _dapo,
          "`prompt[0].content` -> `reward_model.ground_truth`"),
    Entry("DeepScaler", {}, _one("agentica-org/DeepScaleR-Preview-Dataset", split="train"),
          _columns("problem", "answer"), "`problem` -> `answer`"),
    *[Entry(n, {"subset": "main", "split": "train", "extract_answer": True},
            lambda o: [HubCopy("openai/gsm8k", o["subset"] or "main", o["split"])], _gsm8k,
            "`question` -> what follows `####` in `answer` (`extract_answer: false`: all of it)")
      for n in ("GSM8K", "gsm8k")],
    Entry("AIME2024", {}, _one("HuggingFaceH4/aime_2024", split="train"), _columns("problem", "answer"),
          "`problem` -> `answer`"),
    Entry("AIME2025", {}, lambda o: [HubCopy("opencompass/AIME2025", s, "test") for s in ("AIME2025-I", "AIME2025-II")],
          _columns("question", "answer"), "`question` -> `answer`, subsets AIME2025-I then AIME2025-II"),
    Entry("AIME2026", {}, _one("MathArena/aime_2026", split="train"), _columns("problem", "answer"),
          "`problem` -> `answer` (an integer, as text)"),
    Entry("NuminaMath-1.5", {"split": "train", "verifiable_only": True, "require_valid": True},
          _one("AI-MO/NuminaMath-1.5"), _numina,
          "`problem` -> `answer`; rows without a checkable answer dropped (`verifiable_only`), and rows not marked "
          "valid (`require_valid`)"),
    Entry("OpenR1-Math-220k", {"subset": "default", "split": "train"},
          lambda o: [HubCopy("open-r1/OpenR1-Math-220k", o["subset"] or "default", o["split"])],
          _columns("problem", "answer"), "`problem` -> `answer`"),
    Entry("squad", {"split": "train"}, _one("rajpurkar/squad"), _squad,
          "system `context`, user `question`, assistant `answers.text[0]`"),
    Entry("open_assistant", {},
          lambda o: [HubCopy("OpenAssistant/oasst1", file="2023-04-12_oasst_all.trees.jsonl.gz")], _oasst,
          "every root-to-leaf thread of the message trees after NeMo RL's system prompt",
          split_validation_size=0.05),
    Entry("tulu3_sft_mixture", {"max_samples": None, "seed": 42},
          _one("allenai/tulu-3-sft-mixture", split="train"), _messages_rows("tulu3_sft_mixture"),
          "`messages` (ending with an assistant turn); `max_samples` drawn after a seeded shuffle",
          split_validation_size=0.05),
    Entry("HelpSteer3", {"split": "train"}, _one("nvidia/HelpSteer3", subset="preference"), _helpsteer3,
          "`context`, then the preferred of `response1`/`response2` by `overall_preference`"),
    Entry("Nemotron-Cascade-2-SFT-Math", {"split": "train", "max_samples": None, "seed": 42},
          _one("nvidia/Nemotron-Cascade-2-SFT-Data", subset="math"), _messages_rows("Nemotron-Cascade-2-SFT-Math"),
          "`messages` of the `math` subset; `max_samples` drawn after a seeded shuffle", split_validation_size=0.05),
    Entry("openai_format", {"chat_key": "messages", "system_key": None, "system_prompt": None, "tool_key": "tools",
                            "use_preserving_dataset": False},
          _local, _openai_format, "a local JSONL of `chat_key` message lists (`path`), optional system message",
          needs_path=True),
    Entry("general-conversation-jsonl", {"media_data_dir": None}, _local, _conversations,
          "a local file of `conversations` (`from`/`value`) rows (`path`); text only", needs_path=True),
    Entry("arrow_text", {"split": "train", "subset": None, "text_key": "text", "characters_per_sample": None},
          _local, _arrow_text, "`text_key` of a file, glob or hub id (`path`) as one assistant message",
          needs_path=True),
    # NeMo RL's eval datasets (`load_eval_dataset`)
    Entry("math", {}, lambda o: [HubCopy(f"{SIMPLE_EVALS}/math_test.csv")], _math_eval,
          "simple-evals `math_test.csv`: `Question` -> `Answer`"),
    Entry("math500", {}, lambda o: [HubCopy(f"{SIMPLE_EVALS}/math_500_test.csv")], _math_eval,
          "simple-evals `math_500_test.csv`: `Question` -> `Answer`"),
    *[Entry(n, {"seed": 42}, _one("Idavidrein/gpqa", subset=f"gpqa_{v}", split="train"), _gpqa,
            "`Question` with its four answers shuffled (seeded) as A-D -> the correct one's letter")
      for n, v in (("gpqa", "main"), ("gpqa_diamond", "diamond"))],
    Entry("mmlu", {}, lambda o: [HubCopy(f"{SIMPLE_EVALS}/mmlu.csv")], _mmlu,
          "simple-evals `mmlu.csv`: `Question`, options `A`-`D` -> `Answer`"),
    *[Entry(f"mmlu_{lang}", {}, lambda o, lang=lang: [HubCopy(f"{SIMPLE_EVALS}/mmlu_{lang}.csv")], _mmlu,
            f"simple-evals `mmlu_{lang}.csv`: `Question`, options `A`-`D` -> `Answer`") for lang in MMLU_LANGUAGES],
    Entry("mmlu_pro", {}, _one("TIGER-Lab/MMLU-Pro", split="test"), _mmlu_pro,
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
        raise DatasetError(f"{key} = {name!r}: not a NeMo RL dataset name; known: {', '.join(ENTRIES)} (or a hub id "
                           "with data.dataset=hf data.train.path=ID)")
    return ENTRIES[name]


def resolve_options(e: Entry, given: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``given`` over ``e``'s defaults; an option it does not take, or a split it does not have, is an error."""
    unknown = sorted(set(given) - set(e.defaults))
    if unknown:
        takes = ", ".join(e.defaults) or "none"
        raise DatasetError(f"{key}.{unknown[0]}: not an option of {e.name} (its options: {takes}); remove it")
    opts = {**e.defaults, **given}
    if e.splits and opts.get("split") not in e.splits:
        raise DatasetError(f"{key}.split = {opts.get('split')!r}: {e.name} has the splits {', '.join(e.splits)}; "
                           "set one of them")
    return opts


def registry_rows(source: Source, load: Callable[[HubCopy], Iterable[dict]], key: str) -> list[dict]:
    """NeMo RL's rows of ``source``: each hub copy read with ``load`` (a local copy: ``load`` reads
    ``source.path``), then formatted; ``problem``/``answer`` added from ``messages[0]``/``messages[1]``."""
    e = entry(source.name, key)
    opts = resolve_options(e, source.options, key)
    if e.needs_path and not source.path:
        raise DatasetError(f"{key}: {e.name} reads a local file; set {key}.path=FILE")
    if e.needs_path:
        copies = [HubCopy(source.path, opts.get("subset"), opts.get("split", "train"))]
    else:  # a local copy stands where the hub id (or URL) was, read with the same subset and split
        copies = [replace(c, repo=source.path) if source.path else c for c in e.copies(opts)]
    hub_rows = [row for c in copies for row in load(c)]
    out = []
    for row in e.rows(hub_rows, opts):
        messages = row["messages"]
        if len(messages) >= 2:
            row = {**row, "problem": messages[0]["content"], "answer": messages[1]["content"]}
        out.append(row)
    return out


def read_gzip_jsonl(path: str) -> list[dict]:
    """The objects of a gzipped JSON-lines file (OpenAssistant's trees)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
