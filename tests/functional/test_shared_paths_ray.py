"""Under runtime: ray every worker first checks that it sees the run directory the driver wrote; one
that does not stops the run with one line naming its node and the path.

A second node with its own disk is staged on this machine: the driver's probe file is deleted right
after the driver writes it, so the Ray policy actor finds the run directory without it, exactly
what a worker on a node that does not mount the driver's storage finds.
"""

from __future__ import annotations

import pytest

from rlplane.runtime import shared_paths
from tests.tiny import TINY_RUN

TINY = [*TINY_RUN, "grpo.max_num_steps=1", "grpo.val_at_end=false", "logger.progress_bar=false"]


@pytest.mark.ray
def test_worker_that_cannot_see_the_run_directory_stops_the_run_in_one_line(ray_session, tmp_path, monkeypatch,
                                                                           capsys):
    from rlplane.cli import main
    from rlplane.training import session

    def probes_the_workers_do_not_see(dirs):
        shared = shared_paths.write_probes(dirs)
        (tmp_path / "run" / shared_paths.PROBE_NAME).unlink()
        return shared

    monkeypatch.setattr(session, "write_probes", probes_the_workers_do_not_see)
    rc = main(["train", *TINY, "runtime=ray", "data_plane.backend=ray", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    node_ip = ray_session.util.get_node_ip_address()
    assert err[0].startswith(f"rlplane: error: policy worker on node {node_ip} (")
    assert (f"cannot see the run directory {tmp_path / 'run'} (the driver's probe file .rlplane-node-probe is not "
            "there: this node has its own directory at that path); put it on storage every node mounts") in err[0]
    assert not (tmp_path / "run" / "checkpoints" / shared_paths.PROBE_NAME).exists()  # removed at close
