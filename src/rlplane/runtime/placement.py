"""Placement groups under ``runtime: ray``: which bundle of reserved resources each actor runs in.

As NeMo RL, ``policy.generation.colocated.enabled`` chooses **colocated** (bundle ``i`` holds policy rank ``i``
and generator ``i``; generators release weights while the policy trains) or **split** (a ``train`` and a
``generation`` group, on different nodes when ``cluster.num_nodes > 1``). :func:`plan_placement` is pure,
:func:`check_bundles_fit` refuses an impossible plan in one line, :func:`reserve` creates the groups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rlplane.errors import ConfigError

# Seconds to wait for a placement group that fits (others' actors may hold resources).
RESERVE_TIMEOUT_S = 120.0
# Ray's node-id label, matched by a bundle label selector to avoid nodes.
NODE_ID_LABEL = "ray.io/node-id"


@dataclass
class PlacementPlan:
    """``bundles``: group name → its bundles (reserved in order); ``slots``: worker group → ``(group, bundle)``
    per rank; ``apart``: group → the earlier group whose nodes it avoids."""

    bundles: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    slots: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    apart: dict[str, str] = field(default_factory=dict)

    def values_kept_apart(self) -> set[str]:
        """The groups another group keeps apart from (packed, to leave the other nodes free)."""
        return set(self.apart.values())


def plan_placement(*, dp_size: int, num_generators: int, colocated: bool, rank_cpus: dict[str, float],
                   generator_cpus: float, rank_gpus: dict[str, float] | None = None, num_nodes: int = 1,
                   generator_gpus: float = 0.0) -> PlacementPlan:
    """Bundles for ``dp_size`` ranks of each trained group (``rank_cpus``/``rank_gpus`` per rank; rank ``i`` of
    every group shares bundle ``i``) and ``num_generators`` generators (``generator_cpus``/``generator_gpus``
    each).

    Colocated: ``max(dp_size, num_generators)`` bundles; a generator beside a rank shares that rank's GPUs,
    one past the ranks gets its own. Split: ``train`` and ``generation`` groups, the latter apart from the
    former's nodes over ``num_nodes > 1``.
    """
    train_cpus = sum(rank_cpus.values())
    gpus_per_rank = sum((rank_gpus or {}).values())
    plan = PlacementPlan()
    if colocated:
        n = max(dp_size, num_generators)
        plan.bundles["colocated"] = [
            _bundle((train_cpus if i < dp_size else 0.0) + (generator_cpus if i < num_generators else 0.0),
                    gpus_per_rank if i < dp_size else generator_gpus)
            for i in range(n)
        ]
        for name in rank_cpus:
            plan.slots[name] = [("colocated", i) for i in range(dp_size)]
        plan.slots["generators"] = [("colocated", j) for j in range(num_generators)]
        return plan
    plan.bundles["train"] = [_bundle(train_cpus, gpus_per_rank) for _ in range(dp_size)]
    plan.bundles["generation"] = [_bundle(generator_cpus, generator_gpus) for _ in range(num_generators)]
    for name in rank_cpus:
        plan.slots[name] = [("train", i) for i in range(dp_size)]
    plan.slots["generators"] = [("generation", j) for j in range(num_generators)]
    if num_nodes > 1:
        plan.apart["generation"] = "train"
    return plan


def _bundle(cpus: float, gpus: float) -> dict[str, float]:
    return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}


def check_bundles_fit(plan: PlacementPlan, nodes: list[dict[str, float]], num_nodes: int, mode: str) -> None:
    """A one-line :class:`ConfigError` when ``plan`` cannot fit ``nodes`` (too few, a bundle too big, too few
    CPUs/GPUs in all)."""
    if len(nodes) < num_nodes:
        raise ConfigError([
            f"cluster.num_nodes = {num_nodes} but the Ray cluster has {len(nodes)} node(s); lower cluster.num_nodes "
            "or join a bigger cluster (cluster.address)"
        ])
    bundles = [b for group in plan.bundles.values() for b in group]
    for res in ("CPU", "GPU"):
        need = sum(b.get(res, 0.0) for b in bundles)
        have = sum(n.get(res, 0.0) for n in nodes)
        biggest = max((b.get(res, 0.0) for b in bundles), default=0.0)
        per_node = max((n.get(res, 0.0) for n in nodes), default=0.0)
        if need > have + 1e-9 or biggest > per_node + 1e-9:
            sizes = ", ".join(f"{name}: {len(g)} x {g[0]}" for name, g in plan.bundles.items() if g)
            raise ConfigError([
                f"policy.generation.colocated ({mode}): the placement bundles ({sizes}) need {need:g} {res} in all, "
                f"{biggest:g} in one bundle, but the Ray cluster has {have:g} ({per_node:g} on its largest node); "
                "lower policy.dp_size or policy.generation.num_generators, switch colocated/split, or give Ray more "
                "(cluster.num_cpus, cluster.gpus_per_node, cluster.address)"
            ])


def cluster_nodes() -> list[dict[str, float]]:
    """The total resources of each live node of the connected Ray cluster."""
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def reserve(plan: PlacementPlan, num_nodes: int, timeout_s: float = RESERVE_TIMEOUT_S) -> dict:
    """Create and wait for ``plan``'s placement groups (name → group). One node: ``PACK``; several: a group kept
    apart is ``SPREAD`` over the other nodes (label selector), the other ``PACK``ed. One line on timeout."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    groups: dict = {}
    for name, bundles in plan.bundles.items():
        strategy, selector = "PACK", None
        if num_nodes > 1 and name not in plan.values_kept_apart():
            strategy = "SPREAD"
        if name in plan.apart:
            taken = sorted(set(placement_group_table(groups[plan.apart[name]])["bundles_to_node_id"].values()))
            if not any(n["NodeID"] not in taken and fits(bundles[0], n["Resources"])
                       for n in ray.nodes() if n.get("Alive")):
                release(groups)
                raise ConfigError([
                    f"runtime=ray: the {plan.apart[name]!r} placement group took every node of the Ray cluster that "
                    f"could hold a bundle of the {name!r} group (split from it, cluster.num_nodes > 1); add nodes, "
                    "lower policy.dp_size, or set policy.generation.colocated.enabled=true"
                ])
            selector = [{NODE_ID_LABEL: f"!in({','.join(taken)})"}] * len(bundles)
        groups[name] = pg = placement_group(bundles, strategy=strategy, bundle_label_selector=selector)
        if not pg.wait(timeout_seconds=timeout_s):
            for g in groups.values():
                remove_placement_group(g)
            apart = (f" on nodes other than the {plan.apart[name]!r} group's ({len(taken)} node(s))"
                     if name in plan.apart else "")
            raise ConfigError([
                f"runtime=ray: placement group {name!r} ({len(bundles)} bundles){apart} was not placed within "
                f"{timeout_s:g} s (its resources are held by other actors, or no node is left); free the cluster, "
                "lower policy.dp_size / policy.generation.num_generators, or add nodes"
            ])
    return groups


def fits(bundle: dict[str, float], resources: dict[str, float]) -> bool:
    """Whether a node with ``resources`` in all could hold ``bundle``."""
    return all(resources.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items())


def release(groups: dict) -> None:
    """Remove the placement groups made by :func:`reserve` (their actors must be gone)."""
    from ray.util.placement_group import remove_placement_group

    for pg in groups.values():
        remove_placement_group(pg)


def scheduling(groups: dict, slots: list[tuple[str, int]]) -> list:
    """The Ray scheduling strategy of each rank of a worker group placed at ``slots``."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return [PlacementGroupSchedulingStrategy(placement_group=groups[name], placement_group_bundle_index=i)
            for name, i in slots]


def current_placement() -> dict:
    """Inside a Ray actor: node id, placement group id, bundle indices (from its bundle-scoped resource ids;
    ``get_assigned_resources`` names only ``CPU``) and the GPU ids Ray gave it."""
    import ray

    ctx = ray.get_runtime_context()
    pg = ctx.get_placement_group_id()
    names = ray._private.worker.global_worker.core_worker.resource_ids()
    bundles = sorted({int(m.group(1)) for k in names if (m := re.match(r"\w+?_group_(\d+)_", k))})
    return {"node_id": ctx.get_node_id(), "placement_group_id": pg, "bundles": bundles,
            "gpus": [str(i) for i in ray.get_gpu_ids()]}
