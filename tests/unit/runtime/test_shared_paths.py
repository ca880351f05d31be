"""The start-up check that a worker sees the run's directories and model as the driver does
(``runtime/shared_paths.py``): the probe the driver writes, each way a worker's view can differ, the
one-line message naming the node and the path, and reading that line out of Ray's actor error."""

from __future__ import annotations

import os

import pytest

from rlplane.runtime.shared_paths import (
    PROBE_NAME,
    NodePathError,
    check_shared_paths,
    driver_resolved,
    node_label,
    node_path_error_in,
    remove_probes,
    write_probes,
)


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_nothing_to_check_in_the_drivers_process(tmp_path):
    check_shared_paths(None, "policy worker", str(tmp_path / "nowhere"))


def test_a_worker_that_sees_the_probes_passes_and_they_are_removed_at_the_end(tmp_path):
    (tmp_path / "ck").mkdir()
    shared = write_probes({"run directory": tmp_path, "checkpoint directory": tmp_path / "ck"})
    assert (tmp_path / PROBE_NAME).read_text() == shared.token == (tmp_path / "ck" / PROBE_NAME).read_text()
    check_shared_paths(shared, "policy worker", "embedded:tiny-llama")
    remove_probes(shared)
    assert not (tmp_path / PROBE_NAME).exists() and not (tmp_path / "ck" / PROBE_NAME).exists()


def test_run_directory_that_does_not_exist_on_the_node(tmp_path):
    shared = write_probes({"run directory": tmp_path})
    shared.probes[str(tmp_path / "elsewhere")] = shared.probes.pop(str(tmp_path))  # the worker's view
    with pytest.raises(NodePathError) as e:
        check_shared_paths(shared, "policy worker")
    msg = _one_line(e)
    assert msg.startswith(f"policy worker on node {node_label()} cannot see the run directory "
                          f"{tmp_path / 'elsewhere'} (no such directory on this node); put it on storage every node "
                          "mounts")


def test_a_directory_of_its_own_at_that_path(tmp_path):
    # The path exists on the node (/tmp/run does everywhere) but the driver's probe is not in it.
    shared = write_probes({"run directory": tmp_path})
    os.unlink(tmp_path / PROBE_NAME)
    with pytest.raises(NodePathError, match="the driver's probe file .rlplane-node-probe is not there"):
        check_shared_paths(shared, "rollout worker")


def test_a_probe_left_by_another_run(tmp_path):
    shared = write_probes({"checkpoint directory": tmp_path})
    (tmp_path / PROBE_NAME).write_text("0123456789abcdef")
    with pytest.raises(NodePathError) as e:
        check_shared_paths(shared, "value worker")
    assert f"value worker on node {node_label()} cannot see the checkpoint directory {tmp_path} " \
           "(its probe file .rlplane-node-probe is another run's" in _one_line(e)


def test_model_directory_missing_on_the_node(tmp_path):
    shared = write_probes({"run directory": tmp_path})
    with pytest.raises(NodePathError) as e:
        check_shared_paths(shared, "teacher worker", str(tmp_path / "model"))
    assert _one_line(e).startswith(f"teacher worker on node {node_label()} cannot see the model directory "
                                   f"{tmp_path / 'model'} (no config.json there); copy it to that path on every node")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    check_shared_paths(shared, "teacher worker", str(tmp_path / "model"))
    check_shared_paths(shared, "teacher worker", "HuggingFaceTB/SmolLM2-135M-Instruct")  # hub ids: not a path


def test_the_line_is_read_out_of_rays_actor_error():
    # What ray.get raises for an actor whose constructor raised (Ray 2.60): the worker's traceback as text.
    text = ("The actor died because of an error raised in its creation task, ray::PolicyWorker.__init__() "
            "(pid=1, ip=10.0.0.3, actor_id=ab)\n  File \"/x/policy.py\", line 9, in __init__\n"
            "rlplane.runtime.shared_paths.NodePathError: policy worker on node 10.0.0.3 (n3, Ray node 1f) cannot "
            "see the run directory /abs/run (no such directory on this node); put it on storage every node mounts")
    err = node_path_error_in(RuntimeError(text))
    assert isinstance(err, NodePathError)
    assert str(err).startswith("policy worker on node 10.0.0.3 (n3, Ray node 1f) cannot see the run directory /abs/run")
    assert node_path_error_in(RuntimeError("some other failure")) is None


def test_driver_resolves_a_local_model_directory(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    monkeypatch.chdir(tmp_path)
    assert driver_resolved("m") == str(tmp_path / "m")
    assert driver_resolved("org/name") == "org/name"  # a hub id (no such directory here)
    assert driver_resolved("embedded:tiny-llama") == "embedded:tiny-llama"
