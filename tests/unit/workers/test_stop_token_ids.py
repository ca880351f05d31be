"""``policy.generation.stop_token_ids`` (NeMo RL's key): a response ends at the first of those ids, besides the
model's eos; the tokens before it are the ones sampled without it, and the trainer's logprobs of every generated
token, the stop id included, equal the sampler's."""

from __future__ import annotations

import torch

from rlplane.config.loading import load_config
from rlplane.dataplane import make_data_plane
from rlplane.datasets import build_datasets
from rlplane.models.configured import load_configured_policy
from rlplane.workers.logprobs import token_logprobs
from tests.tiny import rollout_worker

G = 2
COLS = ["input_ids", "generation_logprobs", "token_mask"]


def responses(stop_ids: list[int] | None):
    extra = [f"policy.generation.stop_token_ids=[{','.join(map(str, stop_ids))}]"] if stop_ids else []
    cfg = load_config(None, ["grpo.num_prompts_per_step=4", f"grpo.num_generations_per_prompt={G}",
                             "policy.train_global_batch_size=8", "data.num_train_samples=16",
                             "policy.generation.max_new_tokens=12", "warmup.enabled=false", *extra])
    model, tok = load_configured_policy(cfg.policy, cfg.loop.seed)
    loader, _, _ = build_datasets(cfg.dataset_options(), tok)
    dp = make_data_plane("memory")
    dp.register_partition("p", COLS, 4 * G)
    meta, _, _ = rollout_worker(cfg, dp, model=model, tokenizer=tok, seed=0).rollout(next(loader), group_size=G,
                                                                                     partition_id="p")
    cols = dp.get_samples(meta, "p", COLS)
    return model, tok, cfg, cols, meta.seq_lens


def test_responses_end_at_the_first_stop_id_and_logprobs_match():
    model, tok, cfg, plain, plain_lens = responses(None)
    # The stop id: a token the untrained model samples inside some responses (not as their first token).
    gen = [plain["input_ids"][r][plain["token_mask"][r].bool()].tolist() for r in range(len(plain_lens))]
    stop = next(t for resp in gen for t in resp[1:-1])
    _, _, _, cut, cut_lens = responses([stop])
    ended = 0
    for r, whole in enumerate(gen):
        got = cut["input_ids"][r][cut["token_mask"][r].bool()].tolist()
        want = whole[: whole.index(stop) + 1] if stop in whole else whole  # up to and with the stop id
        assert got == want, (r, got, whole)
        ended += stop in whole
    assert ended >= 1
    # The trainer's logprobs of the generated tokens (the stop id among them) are the sampler's.
    ids = cut["input_ids"]
    mask = torch.arange(ids.shape[1])[None, :] < torch.tensor(cut_lens)[:, None]
    with torch.no_grad():
        lp = token_logprobs(model, ids, mask.long(), cfg.policy.generation.temperature)
    on = cut["token_mask"].bool()
    torch.testing.assert_close(lp[on], cut["generation_logprobs"][on], atol=1e-5, rtol=1e-5)
