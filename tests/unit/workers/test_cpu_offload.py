"""``policy.dtensor_cfg.cpu_offload`` (NeMo RL's key): FSDP2 with ``CPUOffloadPolicy`` trains as the plain model
does (one rank, gloo: two AdamW steps, same weights), and its shards live in host memory."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist

from rlplane.config.loading import ConfigError, load_config
from rlplane.models.tiny import build_char_tokenizer, build_tiny_llama
from rlplane.workers import parallel


@pytest.fixture
def one_rank_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parallel.init_dp_group(f"127.0.0.1:{port}", 0, 1, torch.device("cpu"))
    yield
    dist.destroy_process_group()


def two_steps(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    return parallel.full_state_dict(model)


def test_cpu_offloaded_fsdp_trains_as_the_plain_model(one_rank_group):
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    plain = build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    offloaded = build_tiny_llama(tok, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    offloaded.load_state_dict(plain.state_dict())
    parallel.shard_model(offloaded, torch.device("cpu"), 1, cpu_offload=True)
    assert all(p.to_local().device.type == "cpu" for p in offloaded.parameters())
    ids = torch.randint(4, len(tok), (3, 7), generator=torch.Generator().manual_seed(1))
    want, got = two_steps(plain, ids), two_steps(offloaded, ids)
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=1e-5)


def test_cpu_offload_needs_fsdp():
    with pytest.raises(ConfigError, match=r"policy.dtensor_cfg.cpu_offload = true offloads FSDP2 shards"):
        load_config(None, ["policy.dtensor_cfg.cpu_offload=true"])
