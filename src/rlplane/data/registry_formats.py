"""How each of NeMo RL's dataset classes turns hub rows into its rows, ``{"messages": [...], ...}``: one function
per class, ``fn(hub rows, options) -> rows``, with the class's columns and answer extraction (gsm8k keeps what
follows ``####``, DAPO-Math reads ``reward_model.ground_truth``, NuminaMath drops rows it cannot check, ...).
``rlplane.data.registry`` names which function each dataset name uses."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rlplane.data.errors import DatasetError
from rlplane.data.splits import shuffled_indices


def chat(user: str, assistant: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


def columns_rows(problem: str, answer: str) -> Callable[[Iterable[dict], Mapping[str, Any]], Iterable[dict]]:
    """Rows whose problem and answer are two columns (an integer answer as its text, as NeMo RL casts it)."""
    return lambda rows, _opts: ({"messages": chat(r[problem], str(r[answer]))} for r in rows)


def gsm8k_answer(text: str) -> str | None:
    """What follows ``####`` in a GSM8K solution (NeMo RL's ``_extract_hash_answer``); None without one."""
    return text.split("####")[1].strip() if "####" in text else None


def gsm8k_rows(rows, opts):
    for r in rows:
        yield {"messages": chat(r["question"], gsm8k_answer(r["answer"]) if opts["extract_answer"] else r["answer"])}


def dapo_rows(rows, _opts):
    for r in rows:
        yield {"messages": chat(r["prompt"][0]["content"], r["reward_model"]["ground_truth"])}


def omi2_rows(rows, opts):
    for r in rows:
        yield {"messages": chat(r["problem"], r[opts["output_key"]])}


NON_VERIFIABLE_ANSWERS = frozenset({"proof", "notfound"})


def numina_rows(rows, opts):
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
        yield {"messages": chat(r["problem"], r["answer"])}


def squad_rows(rows, _opts):
    for r in rows:
        context = {"role": "system", "content": r["context"]}
        yield {"messages": [context, *chat(r["question"], r["answers"]["text"][0])]}


def ends_with_assistant(messages: list, name: str) -> list:
    if not messages or messages[-1]["role"] != "assistant":
        raise DatasetError(f"dataset {name}: a conversation does not end with an assistant message "
                           f"(last role: {messages[-1]['role'] if messages else 'none'}); fix the row")
    return messages


def sampled(rows: Iterable[dict], opts: Mapping[str, Any]) -> list[dict]:
    """``max_samples`` rows drawn as NeMo RL draws them: ``shuffle(seed)`` then the first N."""
    rows = list(rows)
    n = opts.get("max_samples")
    if n is None or n <= 0:
        return rows
    order = shuffled_indices(len(rows), opts["seed"])
    return [rows[i] for i in order[: min(n, len(rows))]]


def messages_rows(name: str):
    def rows(hub_rows, opts):
        for r in sampled(hub_rows, opts):
            yield {"messages": ends_with_assistant(list(r["messages"]), name)}
    return rows


def helpsteer3_rows(rows, _opts):
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


def oasst_rows(trees, _opts):
    """OpenAssistant trees: one conversation per root-to-leaf path after NeMo RL's system prompt; a lone prompt
    (no reply) is dropped."""
    for tree in trees:
        root = tree.get("prompt")
        if root is None:
            continue
        for thread in oasst_threads(root):
            if len(thread) >= 2:
                yield {"messages": [{"role": "system", "content": OASST_SYSTEM_PROMPT}, *thread]}


def openai_format_rows(rows, opts):
    for r in rows:
        messages = list(r[opts["chat_key"]])
        if opts["system_key"] is not None and opts["system_key"] in r:
            messages = [{"role": "system", "content": r[opts["system_key"]]}, *messages]
        elif opts["system_prompt"]:
            messages = [{"role": "system", "content": opts["system_prompt"]}, *messages]
        row = {"messages": ends_with_assistant(messages, "openai_format")}
        if opts["tool_key"] and opts["tool_key"] in r:
            row["tools"] = r[opts["tool_key"]]
        yield row


MEDIA_TAGS = ("<image>", "<video>", "<audio>", "<video-audio>", "<speech>", "<speeches>", "<sound>", "<audios>",
              "<images>", "<videos>")
CONVERSATION_ROLES = {"user": "user", "assistant": "assistant", "human": "user", "gpt": "assistant",
                      "agent": "assistant"}


def conversations_rows(rows, _opts):
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


def arrow_text_rows(rows, opts):
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


def multichoice_row(question: str, options: dict, answer: str, subject: str | None = None) -> dict:
    row = {"messages": chat(multichoice_problem(question, options), answer), "question": question,
           "options": options, "answer": answer}
    return {**row, "subject": subject} if subject is not None else row


def mmlu_rows(rows, _opts):
    for r in rows:
        yield multichoice_row(r["Question"], {k: r[k] for k in "ABCD"}, r["Answer"], r["Subject"])


def mmlu_pro_rows(rows, _opts):
    for r in rows:
        yield multichoice_row(r["question"], {chr(ord("A") + i): o for i, o in enumerate(r["options"])}, r["answer"],
                               r["category"])


def gpqa_rows(rows, opts):
    """The four choices in a shuffled order, the answer the correct one's letter. NeMo RL shuffles with an
    unseeded ``random.Random()``; here ``seed`` makes the order reproducible."""
    rng = random.Random(opts["seed"])
    for r in rows:
        choices = [r["Correct Answer"], r["Incorrect Answer 1"], r["Incorrect Answer 2"], r["Incorrect Answer 3"]]
        choices = [choices[i] for i in rng.sample(range(4), 4)]
        yield multichoice_row(r["Question"], dict(zip("ABCD", choices)), "ABCD"[choices.index(r["Correct Answer"])])


def math_eval_rows(rows, _opts):
    for r in rows:
        yield {"messages": chat(r["Question"], str(r["Answer"])), "expected_answer": str(r["Answer"])}
