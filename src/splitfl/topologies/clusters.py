"""Clusters: star groups whose server copy a member's *device* hosts (ParallelSFL's top
workers, reached over device-to-device links; groups not in ``Clusters.hosts`` run on the
parameter server). The arithmetic is the star's wherever the server copy runs (the
schedule is :class:`~splitfl.topologies.star.StarFamily`'s); the clock prices each cluster on
:func:`~splitfl.system.cluster.cluster_times` (ParallelSFL Eq. 9, 15), which already shares
the top worker's radio and the server link."""

from __future__ import annotations

from splitfl.core.plan import ClientTask, RoundPlan
from splitfl.core.topology import Clusters
from splitfl.system.cluster import ClusterLoad, MemberLoad, cluster_times
from splitfl.system.cost import ClientCost, Traffic, d2d_rate
from splitfl.topologies.base import register
from splitfl.topologies.star import StarFamily


class ClustersFamily(StarFamily):
    payload = Clusters
    summary = "clusters: star groups whose server copy a member's device hosts (D2D)"

    def price(self, view, plan: RoundPlan, samples: dict[int, int], r: int) -> dict:
        """Each completed bottom worker's round (:func:`bottom_worker_cost`) on the round's
        true profiles, every cluster of the plan timed once."""
        clusters, tasks = self.clock(view, plan, r), {t.client: t for t in plan.tasks}
        return {
            c: bottom_worker_cost(view, plan, tasks[c], n, clusters, r) for c, n in samples.items()
        }

    def share_links(self, view, costs, plan, r):
        """Sharing is part of the cluster model already (top radio and server link)."""
        return costs

    @staticmethod
    def clock(view, plan: RoundPlan, r: int) -> dict:
        """Every cluster of the plan on the true profiles of round ``r``: group → (its
        :class:`~splitfl.system.cluster.ClusterTime`, its ClusterLoad)."""
        pop, prof, hosts = view.population, view.profile, plan.topology.hosts
        label = view.config.devices.label_bytes
        groups = sorted(plan.groups().items())
        loads = []
        for g, tasks in groups:
            top = pop.at(hosts[g], r)
            members = []
            for t in tasks:
                dev, q = pop.at(t.client, r), prof.activation_bytes(t.cut)
                per = view.round_samples(t.client, t.batch_size, t.steps) / t.steps
                members.append(
                    MemberLoad(
                        per * prof.device_flops(t.cut) / dev.flops,
                        per * prof.server_flops(t.cut) / top.flops,
                        d2d_rate(dev, top),
                        per * (q + label),
                        per * q,
                        prof.device_bytes(t.cut),
                    )
                )
            loads.append(
                ClusterLoad(
                    tuple(members), d2d_rate(top, top), top.uplink, top.downlink, prof.total_bytes
                )
            )
        server = pop.server if pop.shared_server else None
        times = cluster_times(loads, server, view.config.devices.contention)
        return {g: (ct, load) for (g, _), ct, load in zip(groups, times, loads, strict=True)}


def bottom_worker_cost(
    view, plan: RoundPlan, task: ClientTask, samples: int, clusters: dict, r: int
) -> ClientCost:
    """A bottom worker's round on :func:`~splitfl.system.cluster.cluster_times`: its own
    time is ``τ_c·t_i + β_c`` (ParallelSFL Eq. 9, 15); the PS model traffic is split equally
    among the members in the accounting; the top worker's compute for its batches is
    ``server_*`` (its queueing included in ``server_time``) and its energy ``helper_energy``."""
    ct, load = clusters[task.group]
    k = [t.client for t in plan.groups()[task.group]].index(task.client)
    m, rate, t_i = load.members[k], ct.d2d_rates[k], ct.member_iteration[k]
    steps, prof = task.steps, view.profile
    transfer = (m.up_bytes + m.down_bytes) / rate
    top = view.population.at(plan.topology.hosts[task.group], r)
    n_c, full = len(load.members), prof.total_bytes
    traffic = Traffic(
        model_down=full / n_c,
        model_up=full / n_c,
        d2d_model=2 * m.model_bytes,
        d2d_activations=steps * m.up_bytes,
        d2d_gradients=steps * m.down_bytes,
    )
    # what the worker and its top worker record of the round (the controller's only view)
    extra = {
        "steps": float(steps),
        "top_compute": steps * m.top_compute,
        "d2d_time": steps * transfer,  # smashed data and gradients over the D2D link
        "ps_down_time": ct.model_times[0],  # top worker: full model from the PS
        "ps_up_time": ct.model_times[2],  # top worker: full model to the PS
        "cluster_time": ct.round_time(steps),
    }
    return ClientCost(
        traffic=traffic,
        device_flops=samples * prof.device_flops(task.cut),
        server_flops=samples * prof.server_flops(task.cut),
        comm_time=steps * transfer + ct.beta_c,
        device_time=steps * m.compute,
        server_time=steps * (t_i - m.compute - transfer),
        extra=extra,
        helper_energy=steps * m.top_compute * top.power,
    )


CLUSTERS = register(ClustersFamily())
