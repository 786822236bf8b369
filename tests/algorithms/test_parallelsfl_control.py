"""ParallelSFL §4.2-4.5 control module (Alg. 1, Eq. 8-18) on hand-made inputs."""

import dataclasses
import math
import warnings

import numpy as np
import pytest

from splitfl.algorithms.estimates import iid_reference
from splitfl.algorithms.parallelsfl.clustering import (
    cluster_label_sets,
    greedy_clusters,
    random_clusters,
)
from splitfl.algorithms.parallelsfl.finetune import _Evaluator, swap_finetune
from splitfl.algorithms.parallelsfl.frequency import aggregation_weights, local_frequencies
from splitfl.algorithms.parallelsfl.monitoring import radio_observations, record_radios
from splitfl.algorithms.parallelsfl.planner import plan_clusters
from splitfl.algorithms.parallelsfl.problem import (
    ClusterInputs,
    cluster_iteration_time,
    cluster_kl,
    cluster_utility,
    cluster_waiting,
    top_capacity_ok,
    total_utility,
    utility_scales,
)
from splitfl.system.cluster import ClusterLoad, MemberLoad, cluster_times


def _one_hot(classes, m):
    v = np.zeros((len(classes), m))
    v[np.arange(len(classes)), classes] = 1.0
    return v


def _uniform_beta(n, value):
    beta = np.full((n, n), float(value))
    np.fill_diagonal(beta, 0.0)
    return beta


def _instance(rng, n, m):
    """A random round: Dirichlet labels, heterogeneous times, some weak or slow tops."""
    v = rng.dirichlet(np.full(m, 0.5), size=n)
    mu_b = rng.uniform(0.1, 2.0, n)
    mu_p = mu_b * rng.uniform(0.05, 0.6, n)
    beta = rng.uniform(0.01, 1.0, (n, n))
    beta = (beta + beta.T) / 2
    np.fill_diagonal(beta, 0.0)
    bandwidth = rng.uniform(0.5, 8.0, n)  # some workers cannot serve even one (B < b = 1)
    return v, mu_b, mu_p, beta, bandwidth, 1.0


def _check_partition(clusters, n):
    roles = [t for t, _ in clusters] + [w for _, m in clusters for w in m]
    assert sorted(roles) == list(range(n))


# ------------------------------------------------------------------------------ Eq. 8 - 11


def _inputs(mu_b, mu_p, beta, bandwidth, b=1.0, **extra):
    """ClusterInputs for time and capacity checks (labels do not matter there)."""
    return ClusterInputs(np.full((len(mu_b), 2), 0.5), mu_b, mu_p, beta, bandwidth, b, **extra)


def test_eq9_iteration_time():
    # a one-member cluster on the cluster time model is Eq. (9) as printed
    mu_b = np.array([1.0, 2.0, 3.0])
    mu_p = np.array([0.5, 0.25, 0.1])
    beta = np.array([[0.0, 0.2, 0.3], [0.2, 0.0, 0.4], [0.3, 0.4, 0.0]])
    inputs = _inputs(mu_b, mu_p, beta, np.ones(3), down_bytes=0.5)
    assert inputs.iteration_time([0], 2) == pytest.approx(1.0 + 0.3 + 0.1)
    assert inputs.iteration_time([1], 0) == pytest.approx(2.0 + 0.2 + 0.5)
    assert inputs.iteration_time([2], 1) == pytest.approx(3.0 + 0.4 + 0.25)


def test_cluster_time_is_the_clocks():
    """Alg. 1 times a cluster with the clock's model (system/cluster.py): members share the
    top worker's radio and its FIFO queue, which Eq. (9) as printed leaves out."""
    up = down = 8000.0
    mu_b = np.array([1.0, 0.010, 0.012, 0.030])
    mu_p = np.array([0.004, 1, 1, 1])
    beta = _uniform_beta(4, (up + down) / 4e6)  # 0.004 s over a pair's link alone
    inputs = _inputs(mu_b, mu_p, beta, np.full(4, 1e9), up, down_bytes=down, radio=np.full(4, 4e6))
    # shared radio: 4e6/3 B/s each, 6 ms per transfer; arrivals 16, 18, 36 ms; the top takes
    # 4 ms per batch in arrival order: done 20, 24, 40 ms; gradients back 6 ms later
    t = [0.026, 0.030, 0.046]
    assert inputs.iteration_time([1, 2, 3], 0) == pytest.approx(0.046)
    assert cluster_waiting([3, 1, 2], 0, inputs) == pytest.approx(0.046 - np.mean(t))
    eq9 = mu_b[1:] + beta[1:, 0] + mu_p[0]  # Eq. (9) as printed: 18, 20, 38 ms
    assert inputs.iteration_time([1, 2, 3], 0) > eq9.max() + 0.007
    # the same numbers through the clock's function
    loads = tuple(MemberLoad(mu_b[i], mu_p[0], 4e6, up, down, 0.0) for i in (1, 2, 3))
    (clock,) = cluster_times([ClusterLoad(loads, 4e6, 1e6, 1e6, 0.0)], None, contention=True)
    assert list(clock.member_iteration) == pytest.approx(t, rel=1e-12)
    assert inputs.timing([1, 2, 3], 0).t_co == clock.t_co
    # Eq. (10)'s right-hand side uses the shared transfer time: 30 + 12 ms
    assert inputs.timing([1, 2, 3], 0).bottom_max == pytest.approx(0.042)
    assert not top_capacity_ok([1, 2, 3], 0, replace_mu_p(inputs, 0.015))
    assert top_capacity_ok([1, 2, 3], 0, replace_mu_p(inputs, 0.014))
    # without a shared radio every member keeps its pair rate: Eq. (9) where nothing queues
    free = _inputs(mu_b, mu_p, beta, np.full(4, 1e9), up, down_bytes=down)
    assert free.iteration_time([1, 3], 0) == pytest.approx(eq9[2])


def replace_mu_p(inputs, top_mu_p):
    mu_p = inputs.mu_p.copy()
    mu_p[0] = top_mu_p
    return dataclasses.replace(inputs, mu_p=mu_p)


def test_eq8_bandwidth():
    n = 6
    mu_b, mu_p, beta = np.ones(n), np.full(n, 1e-3), _uniform_beta(n, 0.0)
    bandwidth = np.array([3.0, 1, 1, 1, 1, 1])
    ok = lambda m, top, b: top_capacity_ok(m, top, _inputs(mu_b, mu_p, beta, bandwidth, b))  # noqa: E731
    assert ok([1, 2, 3], 0, 1.0)
    assert not ok([1, 2, 3, 4], 0, 1.0)
    assert ok([1, 2, 3, 4], 0, 0.75)
    assert not ok([0], 1, 1.5)
    assert ok([], 1, 1.5)


def test_eq10_top_compute():
    n = 4
    mu_b = np.array([1.0, 1.5, 2.5, 0.5])  # μ_b + β to top 0: [-, 1.5, 2.5, 0.5]
    mu_p = np.array([1.0, 1, 1, 1])
    beta, bandwidth = _uniform_beta(n, 0.0), np.full(n, 100.0)
    inputs = _inputs(mu_b, mu_p, beta, bandwidth)
    ok = lambda m: top_capacity_ok(m, 0, inputs)  # noqa: E731
    assert not ok([3])  # 1·1 > 0.5
    assert ok([1])  # 1 ≤ 1.5
    assert not ok([1, 3])  # 2 > max(1.5, 0.5)
    assert ok([2, 3])  # 2 ≤ 2.5: a slower member makes room (Eq. 10 is not monotone)
    assert ok([1, 2])
    assert not ok([1, 2, 3])  # 3 > 2.5
    # β counts on the right-hand side: 3 ≤ 2.5 + 0.5
    beta2 = _uniform_beta(n, 0.5)
    assert top_capacity_ok([1, 2, 3], 0, _inputs(mu_b, mu_p, beta2, bandwidth))


def test_eq11_waiting_and_slowest_time():
    n = 4
    mu_b = np.array([1.0, 1.5, 2.5, 0.5])
    mu_p = np.array([1.0, 9, 9, 9])
    beta = _uniform_beta(n, 0.0)
    inputs = _inputs(mu_b, mu_p, beta, np.ones(n))
    # arrivals 1.5, 2.5, 0.5 are μ_p = 1 apart: t_i = [2.5, 3.5, 1.5]; W = mean(1, 0, 2) = 1
    assert cluster_waiting([1, 2, 3], 0, inputs) == pytest.approx(1.0)
    assert cluster_iteration_time([1, 2, 3], 0, inputs) == pytest.approx(3.5)
    assert cluster_waiting([2], 0, inputs) == 0.0
    assert cluster_waiting([], 0, inputs) == 0.0
    assert cluster_iteration_time([], 0, inputs) == 0.0
    # a per-pair β enters t_i: worker 3 now arrives at 2.5 with worker 2 and queues behind it
    # (Eq. 9 as printed would give t = [2.5, 3.5, 3.5], W = 1/3)
    beta2 = beta.copy()
    beta2[3, 0] = beta2[0, 3] = 2.0
    queued = _inputs(mu_b, mu_p, beta2, np.ones(n))
    assert cluster_iteration_time([1, 2, 3], 0, queued) == pytest.approx(4.5)
    assert cluster_waiting([1, 2, 3], 0, queued) == pytest.approx(4.5 - 3.5)


# ------------------------------------------------------------------------------ Eq. 12 - 14


def test_eq12_13_cluster_kl():
    v = _one_hot([0, 1, 2, 3, 0], 4)
    phi0 = np.full(4, 0.25)
    assert cluster_kl([0, 1, 2, 3], v, phi0) == pytest.approx(0.0, abs=1e-15)
    assert cluster_kl([0, 1], v, phi0) == pytest.approx(math.log(2))
    assert cluster_kl([2], v, phi0) == pytest.approx(math.log(4))
    # Φ_c = [2/3, 1/3, 0, 0]: direction KL(Φ_c ‖ Φ_0) (finite although classes are missing)
    expected = 2 / 3 * math.log((2 / 3) / 0.25) + 1 / 3 * math.log((1 / 3) / 0.25)
    assert cluster_kl([0, 4, 1], v, phi0) == pytest.approx(expected)
    assert cluster_kl([], v, phi0) == 0.0


def test_eq14_utility_and_scales():
    n = 4
    v = _one_hot([0, 1, 2, 3], 4)
    phi0 = iid_reference(v)
    mu_b = np.array([1.0, 1.5, 2.5, 0.5])
    mu_p = np.array([1.0, 1, 1, 1])
    beta = _uniform_beta(n, 0.0)
    lam, w_scale, kl_scale = 0.25, 2.0, math.log(4)
    inputs = ClusterInputs(v, mu_b, mu_p, beta, np.ones(n), 1.0, lam, phi0, w_scale, kl_scale)
    u = cluster_utility([1, 2, 3], 0, inputs)
    # W = 1, KL = log(4/3)
    assert u == pytest.approx(0.25 * 1.0 / 2.0 + 0.75 * math.log(4 / 3) / math.log(4))
    clusters = [(0, [1, 2, 3])]
    assert total_utility(clusters, inputs) == u
    # scales: mean Eq. (9) time over ordered pairs, and the worst single worker's KL
    w_s, kl_s = utility_scales(v, mu_b, mu_p, _uniform_beta(n, 0.3))
    one = _inputs(mu_b, mu_p, _uniform_beta(n, 0.3), np.ones(n))
    brute = np.mean([one.iteration_time([i], j) for i in range(n) for j in range(n) if i != j])
    assert w_s == pytest.approx(brute)
    assert kl_s == pytest.approx(math.log(4))
    assert utility_scales(np.full((3, 2), 0.5), np.zeros(3), np.zeros(3), np.zeros((3, 3))) == (
        1.0,
        1.0,
    )


def test_evaluator_matches_scalar_functions():
    rng = np.random.default_rng(11)
    v, mu_b, mu_p, beta, bandwidth, b = _instance(rng, 12, 5)
    phi0 = iid_reference(v)
    radio = rng.uniform(1.0, 4.0, 12)  # members share their top's radio (and queue)
    inputs = ClusterInputs(
        v, mu_b, mu_p, beta, bandwidth, b, 0.4, phi0, 0.7, 0.9, down_bytes=0.5, radio=radio
    )
    ev = _Evaluator(inputs)
    members, top = [1, 4, 6], 0
    for cands in ([2, 3, 7], [9]):
        util, ok = ev.add_one(members, top, cands)
        for j, u, f in zip(cands, util, ok, strict=True):
            cand = members + [j]
            assert u == pytest.approx(cluster_utility(cand, top, inputs), abs=1e-12)
            assert f == top_capacity_ok(cand, top, inputs)
    util, ok = ev.swap_in(members, top, 8)
    for q in range(len(members)):
        cand = members[:q] + [8] + members[q + 1 :]
        assert util[q] == pytest.approx(cluster_utility(cand, top, inputs), abs=1e-12)
        assert ok[q] == top_capacity_ok(cand, top, inputs)


def test_radio_observations_by_hand():
    # top 0 shares its radio: members 1 and 2 near the best rate (held back, maybe), member 3
    # far below it (its own radio); a one-member cluster 5 <- 6; a cluster 7 with nobody measured
    clusters = {0: [(1, 4.0), (2, 3.0), (3, 1.0)], 5: [(6, 2.0)], 7: []}
    got = radio_observations(clusters, contention=True)
    assert got == {
        1: (4.0, False),
        2: (3.0, False),
        3: (1.0, True),
        0: (8.0, True),  # the top worker's radio carried 4 + 3 + 1
        6: (2.0, False),
        5: (2.0, True),
    }
    free = radio_observations(clusters, contention=False)  # no sharing: the top is >= the best
    assert free[0] == (4.0, False) and free[3] == (1.0, True) and free[5] == (2.0, False)
    seen = np.array([10.0, 3.5, 3.5, 3.5, 0.0, 1.0, 1.0, 9.0])
    record_radios(seen, got)  # exact rates replace, lower bounds only raise
    assert seen.tolist() == [8.0, 4.0, 3.5, 1.0, 0.0, 2.0, 2.0, 9.0]


# ------------------------------------------------------------------------------ Eq. 15 - 18


def test_eq17_local_frequencies():
    tf = lambda t, beta, tau, cl=None: local_frequencies(cl, t, beta, tau).tolist()  # noqa: E731
    assert tf([1.0, 2.0, 4.0], [0.0, 0.0, 0.0], 8) == [8, 4, 2]
    # fractional: target 8, 8/3 = 2.67 -> 2; 8/5 = 1.6 -> 1
    assert tf([1.0, 3.0, 5.0], [0.0, 0.0, 0.0], 8) == [8, 2, 1]
    # β_l raises the target: 8·1 + 1 = 9 -> 9/2 = 4.5 -> 4, 9/4 -> 2
    assert tf([1.0, 2.0, 4.0], [1.0, 0.0, 0.0], 8) == [8, 4, 2]
    # β_c of a slow cluster lowers its τ_c: (8 - 2)/2 = 3
    assert tf([1.0, 2.0], [0.0, 2.0], 8) == [8, 3]
    # the fastest cluster need not be first; fastest is judged at τ including β
    assert tf([4.0, 1.0], [0.0, 0.0], 6) == [1, 6]
    assert tf([1.0, 2.0], [10.0, 0.0], 4) == [1, 4]  # 14 vs 8: cluster 1 is the fastest
    # exact quotients are not floored down by float error: 6·0.1 = 0.6000000000000001
    assert tf([0.1, 0.2, 0.3], [0.0, 0.0, 0.0], 6) == [6, 3, 2]
    # top-only clusters get 0 and do not take part
    clusters = [(0, [1]), (2, []), (3, [4])]
    assert tf([1.0, 0.0, 2.0], [0.0, 0.0, 0.0], 8, clusters) == [8, 0, 4]
    assert tf([0.0], [0.0], 8, [(0, [])]) == [0]
    # round times never exceed the fastest cluster's (unless τ_c = 1)
    rng = np.random.default_rng(0)
    for _ in range(50):
        t = rng.uniform(0.1, 5.0, 6)
        beta = rng.uniform(0.0, 3.0, 6)
        taus = local_frequencies(None, t, beta, 10)
        target = np.min(10 * t + beta)
        assert taus.max() == 10 and taus.min() >= 1
        assert np.all((taus * t + beta <= target + 1e-9) | (taus == 1))
        assert np.all(((taus + 1) * t + beta > target - 1e-9) | (taus == 10))


def test_eq18_aggregation_weights():
    assert aggregation_weights([3, 2, 0], [8, 4, 0]).tolist() == pytest.approx([0.75, 0.25, 0.0])
    assert aggregation_weights([1, 1], [5, 5]).tolist() == [0.5, 0.5]
    with pytest.raises(ValueError):
        aggregation_weights([0, 0], [8, 4])


# ------------------------------------------------------------------------------- Alg. 1 1-2


def test_label_sets_kmeans():
    rng = np.random.default_rng(0)
    groups = [0] * 5 + [1] * 4 + [2] * 6
    v = _one_hot(groups, 3) * 0.9 + 0.1 / 3 + rng.uniform(0, 0.01, (15, 3))
    v /= v.sum(1, keepdims=True)
    sets = cluster_label_sets(v, 3, np.random.default_rng(1))
    got = sorted(sorted(s.tolist()) for s in sets)
    assert got == [list(range(0, 5)), list(range(5, 9)), list(range(9, 15))]
    again = cluster_label_sets(v, 3, np.random.default_rng(1))
    assert [s.tolist() for s in sets] == [s.tolist() for s in again]
    assert [s.tolist() for s in cluster_label_sets(v, 1, rng)] == [list(range(15))]
    # K above the number of distinct vectors is clamped (no sklearn warning)
    dup = _one_hot([0, 1] * 5, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sets = cluster_label_sets(dup, 5, rng)
    assert sorted(sorted(s.tolist()) for s in sets) == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    assert cluster_label_sets(np.zeros((0, 3)), 2, rng) == []


# ------------------------------------------------------------------------------ Alg. 1 3-10


def test_greedy_by_hand():
    # one label set; top = max B; members = slowest first until Eq. (8) binds
    n = 6
    v = np.full((n, 3), 1 / 3)
    mu_b = np.array([1.0, 2, 3, 4, 5, 6])
    mu_p = np.full(n, 1e-3)
    beta = _uniform_beta(n, 0.0)
    bandwidth = np.array([2.0, 1, 1, 1, 1, 1])
    got = greedy_clusters(
        ClusterInputs(v, mu_b, mu_p, beta, bandwidth, 1.0), 1, np.random.default_rng(0)
    )
    # cluster 1: top 0 takes 5 and 4; cluster 2: top 1 (tie on B -> lower index) takes 3;
    # worker 2 can serve nobody and no cluster has room: a top-only cluster
    assert got == [(0, [4, 5]), (1, [3]), (2, [])]


def test_greedy_top_only_and_deferred_tops():
    n = 4
    v = np.full((n, 2), 0.5)
    mu_b, mu_p, beta = np.array([1.0, 2, 3, 4]), np.full(n, 1e-3), _uniform_beta(n, 0.0)
    bandwidth = np.array([1.0, 0.5, 0.5, 0.5])  # only worker 0 can serve one bottom worker
    got = greedy_clusters(
        ClusterInputs(v, mu_b, mu_p, beta, bandwidth, 1.0), 1, np.random.default_rng(0)
    )
    assert got == [(0, [3]), (1, []), (2, [])]
    # the largest label set has only weak workers: they are deferred, then become bottoms of
    # the strong worker of the small set
    n = 6
    v = _one_hot([0, 0, 0, 0, 1, 1], 2)
    bandwidth = np.array([0.5, 0.5, 0.5, 0.5, 0.5, 10.0])
    mu_b, mu_p, beta = np.arange(1.0, 7.0), np.full(n, 1e-3), _uniform_beta(n, 0.0)
    got = greedy_clusters(
        ClusterInputs(v, mu_b, mu_p, beta, bandwidth, 1.0), 2, np.random.default_rng(0)
    )
    assert got == [(5, [0, 1, 2, 3, 4])]
    # a single worker
    rng = np.random.default_rng(0)
    one = ClusterInputs(v[:1], mu_b[:1], mu_p[:1], beta[:1, :1], bandwidth[:1], 1.0)
    got = greedy_clusters(one, 1, rng)
    assert got == [(0, [])]


def test_greedy_balances_labels():
    # one top that can serve 3; three label sets; the greedy takes one of each class
    v = _one_hot([0, 0, 0, 1, 1, 2, 2], 3)
    v[0] = [0.2, 0.4, 0.4]  # the top worker (max B) sits in the largest set
    n = v.shape[0]
    bandwidth = np.array([3.0, 1, 1, 1, 1, 1, 1])
    mu_b, mu_p, beta = np.ones(n), np.full(n, 1e-3), _uniform_beta(n, 0.0)
    inputs = ClusterInputs(v, mu_b, mu_p, beta, bandwidth, 1.0)
    clusters = greedy_clusters(inputs, 3, np.random.default_rng(0))
    top, members = clusters[0]
    assert top == 0
    assert sorted(np.argmax(v[members], axis=1).tolist()) == [0, 1, 2]
    _check_partition(clusters, n)


def test_constraints_and_roles_on_random_instances():
    rng = np.random.default_rng(2024)
    for trial in range(30):
        n = int(rng.integers(1, 31))
        v, mu_b, mu_p, beta, bandwidth, b = _instance(rng, n, int(rng.integers(2, 8)))
        if trial % 5 == 0:
            mu_p = mu_p * 20  # slow tops: Eq. (10) binds
        phi0 = iid_reference(v)
        # odd trials: members share their top's radio (as with devices.contention)
        time_model = {"down_bytes": 0.5, "radio": rng.uniform(1.0, 8.0, n) if trial % 2 else None}
        inputs = ClusterInputs(v, mu_b, mu_p, beta, bandwidth, b, **time_model)
        greedy = greedy_clusters(inputs, max(1, n // 5), rng)
        _check_partition(greedy, n)
        for c, (top, members) in enumerate(greedy):
            assert top_capacity_ok(members, top, inputs)
            if not members:  # a top-only cluster: no cluster could take it as a bottom worker
                for d, (t2, m2) in enumerate(greedy):
                    if d != c:
                        assert not top_capacity_ok(m2 + [top], t2, inputs)
        w_s, kl_s = utility_scales(v, mu_b, mu_p, beta)
        for lam in (0.0, 0.5, 1.0):
            inputs = ClusterInputs(
                v, mu_b, mu_p, beta, bandwidth, b, lam, phi0, w_s, kl_s, **time_model
            )
            tuned = swap_finetune(greedy, inputs)
            _check_partition(tuned, n)
            assert [t for t, _ in tuned] == [t for t, _ in greedy]
            for top, members in tuned:
                assert top_capacity_ok(members, top, inputs)
            before = total_utility(greedy, inputs)
            after = total_utility(tuned, inputs)
            assert after <= before + 1e-12


# ------------------------------------------------------------------------------- Alg. 1 11


def _speed_instance():
    """16 workers: 0-7 fast (μ_b = 1), 8-15 slow (μ_b = 10); fast hold classes 0/1, slow 2/3."""
    n = 16
    v = _one_hot([0] * 4 + [1] * 4 + [2] * 4 + [3] * 4, 4)
    mu_b = np.array([1.0] * 8 + [10.0] * 8)
    mu_p = np.full(n, 0.01)
    beta = _uniform_beta(n, 0.1)
    bandwidth = np.full(n, 3.0)  # each top serves at most 3 bottom workers
    return v, mu_b, mu_p, beta, bandwidth, 1.0


def test_lambda_one_groups_similar_speeds():
    v, mu_b, mu_p, beta, bandwidth, b = _speed_instance()
    phi0 = iid_reference(v)
    w_s, kl_s = utility_scales(v, mu_b, mu_p, beta)
    mixed = [(0, [1, 9, 10]), (4, [5, 11, 13]), (8, [2, 6, 14]), (12, [3, 7, 15])]
    inputs = ClusterInputs(v, mu_b, mu_p, beta, bandwidth, b, 1.0, phi0, w_s, kl_s)
    tuned = swap_finetune(mixed, inputs)
    _check_partition(tuned, 16)
    for top, members in tuned:
        assert len(set(mu_b[members].tolist())) == 1  # speed-homogeneous
        # what is left is the top worker's queue: batches served μ_p apart, W = μ_p
        assert cluster_waiting(members, top, inputs) == pytest.approx(mu_p[top])
    # from the greedy plan, fine-tuning with λ = 1 never increases the total waiting time
    greedy = greedy_clusters(inputs, 3, np.random.default_rng(0))
    tuned = swap_finetune(greedy, inputs)
    wait = lambda cl: sum(cluster_waiting(m, t, inputs) for t, m in cl)  # noqa: E731
    assert wait(tuned) <= wait(greedy) + 1e-12


def test_lambda_zero_minimises_kl():
    # 12 one-class workers, 3 classes × 4; tops 0, 4, 8 (one per class); each top serves 3
    n = 12
    v = _one_hot([i // 4 for i in range(n)], 3)
    phi0 = iid_reference(v)
    mu_b = np.linspace(1.0, 3.0, n)
    mu_p, beta, bandwidth = np.full(n, 0.01), _uniform_beta(n, 0.1), np.full(n, 3.0)
    w_s, kl_s = utility_scales(v, mu_b, mu_p, beta)
    inputs = ClusterInputs(v, mu_b, mu_p, beta, bandwidth, 1.0, 0.0, phi0, w_s, kl_s)
    pure = [(0, [1, 2, 3]), (4, [5, 6, 7]), (8, [9, 10, 11])]  # every cluster one class
    tuned = swap_finetune(pure, inputs)
    for _, members in tuned:
        assert cluster_kl(members, v, phi0) == pytest.approx(0.0, abs=1e-12)
    # random starts with the same tops: KL never rises, and reaches 0 (a balanced split exists)
    rng = np.random.default_rng(5)
    for _ in range(5):
        perm = rng.permutation([w for w in range(n) if w % 4])
        start = [(t, sorted(perm[3 * c : 3 * c + 3].tolist())) for c, t in enumerate((0, 4, 8))]
        tuned = swap_finetune(start, inputs)
        kl = lambda cl: sum(cluster_kl(m, v, phi0) for _, m in cl)  # noqa: E731
        assert kl(tuned) <= kl(start) + 1e-12
        assert kl(tuned) == pytest.approx(0.0, abs=1e-12)
    # and never worse than the greedy plan
    greedy = greedy_clusters(inputs, 3, np.random.default_rng(0))
    tuned = swap_finetune(greedy, inputs)
    kl_g = sum(cluster_kl(m, v, phi0) for _, m in greedy)
    assert sum(cluster_kl(m, v, phi0) for _, m in tuned) <= kl_g + 1e-12


def test_moves_fill_top_only_cluster_and_never_empty_one():
    n = 5
    v = _one_hot([0, 1, 0, 1, 0], 2)
    phi0 = iid_reference(v)
    mu_b, mu_p, beta = np.array([1.0, 1, 1, 1, 5]), np.full(n, 0.01), _uniform_beta(n, 0.0)
    bandwidth = np.full(n, 5.0)
    w_s, kl_s = utility_scales(v, mu_b, mu_p, beta)
    args = (v, mu_b, mu_p, beta, bandwidth, 1.0)
    one, zero = (ClusterInputs(*args, lam, phi0, w_s, kl_s) for lam in (1.0, 0.0))
    # λ = 1: the slow worker 4 makes 0 and 2 wait; first-improvement moves 0 (W: 8/3 -> 2),
    # then 2 (W -> 0) to the idle top 3, which thereby starts training
    start = [(1, [0, 2, 4]), (3, [])]
    assert swap_finetune(start, one) == [(1, [4]), (3, [0, 2])]
    assert swap_finetune(start, one, allow_moves=False) == start
    # λ = 0: emptying cluster 1 would drop its KL term, but a cluster is never emptied
    single = [(1, [0]), (3, [2, 4])]
    assert swap_finetune(single, zero) == single


# ---------------------------------------------------------------------------- R and pipeline


def test_random_clusters():
    rng = np.random.default_rng(0)
    got = random_clusters(10, [3, 2, 2], rng)
    _check_partition(got, 10)
    assert [len(m) for _, m in got] == [3, 2, 2]
    assert got == random_clusters(10, [3, 2, 2], np.random.default_rng(0))
    balanced = random_clusters(11, 3, rng)  # 8 bottoms over 3 clusters
    _check_partition(balanced, 11)
    assert [len(m) for _, m in balanced] == [3, 3, 2]
    with pytest.raises(ValueError):
        random_clusters(10, [3, 3], rng)
    with pytest.raises(ValueError):
        random_clusters(3, 4, rng)


def test_plan_clusters_pipeline_and_determinism():
    rng = np.random.default_rng(7)
    inst = _instance(rng, 25, 6)
    beta_ps = rng.uniform(0.0, 2.0, 25)
    inputs = ClusterInputs(*inst)
    out1 = plan_clusters(inputs, np.random.default_rng(3), tau=10, beta_ps=beta_ps)
    out2 = plan_clusters(inputs, np.random.default_rng(3), tau=10, beta_ps=beta_ps)
    assert out1[0] == out2[0]
    assert out1[1].tolist() == out2[1].tolist()
    assert out1[2] == out2[2]
    clusters, taus, info = out1
    _check_partition(clusters, 25)
    assert info["sum_utility"] <= info["sum_utility_greedy"] + 1e-12
    assert info["n_clusters"] == len(clusters) == len(taus)
    assert info["n_top_only"] == sum(1 for _, m in clusters if not m)
    training = taus[[bool(m) for _, m in clusters]]
    assert training.max() == 10 and training.min() >= 1
    for key in ("mean_kl", "mean_waiting", "w_scale", "kl_scale", "round_time"):
        assert np.isfinite(info[key])
    # -WC: same clusters, fixed τ; -R: greedy sizes, random membership, no fine-tuning
    wc = plan_clusters(inputs, np.random.default_rng(3), tau=10, adaptive_tau=False)
    assert wc[0] == clusters
    assert wc[1].tolist() == [10 if m else 0 for _, m in clusters]
    r = plan_clusters(
        inputs, np.random.default_rng(3), tau=10, random_assignment=True, adaptive_tau=False
    )
    _check_partition(r[0], 25)
    greedy = greedy_clusters(inputs, 5, np.random.default_rng(3))  # same draws as plan_clusters
    assert [len(m) for _, m in r[0]] == [len(m) for _, m in greedy]


def test_plan_clusters_small_cases():
    v = np.array([[1.0, 0.0], [0.0, 1.0]])
    mu_b, mu_p, beta, bandwidth = np.ones(2), np.full(2, 0.1), _uniform_beta(2, 0.5), np.ones(2)
    rng = np.random.default_rng(0)
    inputs = ClusterInputs(v, mu_b, mu_p, beta, bandwidth, 1.0)
    clusters, taus, info = plan_clusters(inputs, rng, tau=5)
    assert clusters == [(0, [1])]
    assert taus.tolist() == [5]
    assert info["t_co"] == pytest.approx([1.0 + 0.5 + 0.1])
    one = (v[:1], mu_b[:1], mu_p[:1], beta[:1, :1], np.ones(1), 1.0)
    clusters, taus, info = plan_clusters(ClusterInputs(*one), rng, tau=5)
    assert clusters == [(0, [])] and taus.tolist() == [0] and info["n_top_only"] == 1


def test_local_search_skips_settled_pairs_and_asks_unchanged_clusters_once(monkeypatch):
    """Issue 54 (N = 200: 101,335 candidate evaluations): a cluster pair that found no swap
    and whose clusters did not change since, and a cluster asked about a worker while it did
    not change, are not evaluated again — the same clusters as the search re-evaluating
    everything every pass (written here as the search with both records cleared), fewer
    ``_Evaluator._many`` calls."""
    from splitfl.algorithms.parallelsfl import finetune

    rng = np.random.default_rng(3)
    inputs = ClusterInputs(*_instance(rng, 60, 6))
    start = greedy_clusters(inputs, 12, np.random.default_rng(4))
    calls = [0]
    real = finetune._Evaluator._many

    def counted(self, candidates, top):
        calls[0] += 1
        return real(self, candidates, top)

    monkeypatch.setattr(finetune._Evaluator, "_many", counted)
    tuned = swap_finetune(start, inputs)
    lean = calls[0]

    class Forgetful(finetune._Search):  # every pass evaluates every pair and worker again
        def swaps(self):
            getattr(self, "settled", {}).clear()
            getattr(self, "joined", {}).clear()
            return super().swaps()

    monkeypatch.setattr(finetune, "_Search", Forgetful)
    calls[0] = 0
    assert swap_finetune(start, inputs) == tuned
    assert tuned != start  # the search changed something, over several passes
    assert lean < 0.8 * calls[0], (lean, calls[0])
