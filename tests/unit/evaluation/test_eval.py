"""pass@k by hand, and `rlplane eval` end to end on the embedded model (JSON result, consistency)."""

from __future__ import annotations

import json

import pytest

from rlplane.cli import main
from rlplane.evaluation import pass_at_k


def test_pass_at_k_hand_computed():
    # n = 4 samples, c = 1 correct: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5;
    # pass@4 = 1 (the correct one is always among all four).
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0
    # none correct: 0 whatever k; all correct: 1.
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    # n = 5, c = 2, k = 2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_eval_cli_writes_consistent_json(tmp_path, capsys):
    out = tmp_path / "result.json"
    # A sequence budget of 2 new tokens: the untrained tiny model is cut at the length cap.
    rc = main(["eval", "--model", "embedded:tiny-llama", "--dataset", "arithmetic", "-n", "6", "-k", "3",
               "--max-new-tokens", "2", "--quiet", "-o", str(out)])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    result = json.loads(out.read_text())
    assert printed == result
    assert result["num_problems"] == 6 and result["model"] == "embedded:tiny-llama"
    assert result["accuracy"] == result["greedy"]["mean_reward"]
    assert result["greedy"]["max_generation_length"] <= 2 and result["sampled"]["k"] == 3
    assert 0.0 <= result["pass@1_sampled"] <= result["pass@3"] <= 1.0


def test_eval_routes_jsonl_rows_and_scores_a_saved_model_directory(tmp_path, capsys):
    # Ground truths are chosen so the expected accuracy is known: rows 0-1 (arithmetic, exact
    # match) take the model's own greedy continuation as their answer, row 2 a wrong one, row 3
    # goes to the math env with an answer nothing matches. Expected accuracy: 2 / 4.
    pytest.importorskip("math_verify", reason="needs the math extra")
    import torch

    from rlplane.models import build_char_tokenizer, build_tiny_llama

    tok = build_char_tokenizer()
    model = build_tiny_llama(tok, seed=5)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    problems = ["1+2=", "3+4=", "5+6=", "7+8="]
    greedy = []
    for p in problems[:2]:
        ids = torch.tensor([tok(p)["input_ids"]])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
        greedy.append(tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip())
    rows = [{"problem": problems[0], "answer": greedy[0]}, {"problem": problems[1], "answer": greedy[1]},
            {"problem": problems[2], "answer": "not-this"},
            {"problem": problems[3], "answer": "x^9", "task_name": "math"}]
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval", "--checkpoint", str(tmp_path / "m"), "--dataset", str(data), "--max-new-tokens", "3",
                 "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_problems"] == 4 and result["dataset"] == f"jsonl:{data}"
    assert result["accuracy"] == 0.5


def test_eval_reports_what_one_constant_answer_scores(tmp_path, capsys):
    # References 7, 7, 7, 3: always answering "7" is right on 3 of 4 = 0.75, the floor a policy that collapses
    # onto one answer reaches with no skill; the screen shows it beside greedy accuracy.
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a, b in [(3, 4), (5, 2), (1, 6), (1, 2)]))
    assert main(["eval", "--model", "embedded:tiny-llama", "--dataset", str(data), "--max-new-tokens", "1",
                 "--quiet"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["constant_answer"] == {"answer": "7", "accuracy": 0.75}
    assert "always answering '7': 0.7500" in captured.err
