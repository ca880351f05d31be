"""Write train.jsonl and val.jsonl: 2-digit additions, one {"problem", "answer"} object per line."""

import json
import random

rng = random.Random(0)
pairs = [(a, b) for a in range(100) for b in range(100)]
rng.shuffle(pairs)
for name, rows in (("val.jsonl", pairs[:500]), ("train.jsonl", pairs[500:3500])):
    with open(name, "w") as f:
        for a, b in rows:
            f.write(json.dumps({"problem": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
