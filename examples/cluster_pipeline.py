"""A pipeline whose stages span Ray nodes (hostless.cluster); runs on a laptop with no cluster.

    python examples/cluster_pipeline.py              # ray.init()'s local Ray: one node
    python examples/cluster_pipeline.py --nodes 2    # a local 2-node Ray cluster (ray.cluster_utils)
    python examples/cluster_pipeline.py --address ray://...  # an existing cluster: its first two nodes

Needs Ray: ``pip install 'hostless[ray]'``.  Each node used gets a node host (a Ray actor
pinned there) with its own domain and agents; the stages of one node run there as a local
hostless graph (shared memory, direct dispatch); Ray carries the tensors between nodes.
"""

from __future__ import annotations

import argparse

import numpy as np

from hostless.cluster import Cluster, RemoteStageFailed


def normalize(x: np.ndarray) -> np.ndarray:  # a stage function: module level, imported by name
    return (x - x.mean()) / (x.std() + 1e-6)


def picky(x: np.ndarray) -> np.ndarray:
    if not np.isfinite(x).all():
        raise ValueError("a frame with NaN")
    return x


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1, help="start a local Ray cluster of this many nodes")
    ap.add_argument("--address", default=None, help="an existing Ray cluster")
    a = ap.parse_args()
    local = None
    if a.nodes > 1 and a.address is None:
        from ray.cluster_utils import Cluster as RayCluster  # one raylet per "node", on this machine

        local = RayCluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        for _ in range(a.nodes - 1):
            local.add_node(num_cpus=1)
        local.wait_for_nodes()
    cl = Cluster(address=a.address or (local.address if local else None), heap="32M")
    try:
        nodes = cl.nodes()
        first, second = nodes[0], nodes[-1]  # the same node when there is one
        cam = cl.spawn("cpu", node=first)
        npu = cl.spawn("npu", node=first)
        post = cl.spawn("cpu", node=second)
        W = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
        g = (
            cl.graph()
            .input("frame", (32, 64), "f4")
            .constant("W", W)
            .stage("norm", cam, normalize, ["frame"], ("x", (32, 64), "f4"))
            .stage("infer", npu, "gemm", ["x", "W"], ("y", (32, 16), "f4"))
            .stage("check", post, picky, ["y"], ("z", (32, 16), "f4"))
            .stage("act", post, "relu", ["z"], ("out", (32, 16), "f4"))
        )
        rng = np.random.default_rng(1)
        frames = [rng.standard_normal((32, 64)).astype(np.float32) for _ in range(8)]
        with g.compile(dispatch="direct", data="shared", inflight=4) as cg:
            print(cg.plan())
            outs = [o["out"] for o in cg.stream(frames)]
            for f, o in zip(frames, outs, strict=True):
                np.testing.assert_allclose(o, np.maximum(normalize(f) @ W, 0), rtol=1e-4, atol=1e-4)
            used = len({first, second})
            print(f"{len(outs)} frames over {used} node(s): results as on one machine")
            bad = frames[0].copy()
            bad[0, 0] = np.nan
            try:
                cg.run({"frame": bad})
            except RemoteStageFailed as e:
                print(f"a bad frame failed on its node, the graph goes on: {str(e).splitlines()[0]}")
            cg.run({"frame": frames[1]})
    finally:
        cl.close()  # (and ray.shutdown() when it started Ray)
        if local is not None:
            import ray

            ray.shutdown()
            local.shutdown()


if __name__ == "__main__":
    main()
