"""Multi-process runs (issue 16) with examples/torch-ddp: torchrun in the container, gloo on CPU.

Two 2-process runs are bitwise identical; the record holds the world size, each rank's seed (derived by
the runtime, as reported by each rank) and device, the backend and its version, the NCCL_*/GLOO_*
variables and every rank's logs; world size 1 vs 2 differ and `hermetic diff` names it; a replay runs
the recorded layout again. Through Slurm: two nodes, one container each started by srun, meeting at
the first node, the same bits as two processes on one node.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buildsupport import clone_cache
from conftest import run_cli
from run_support import build, copy_example, diff_json, hermetic_run, material_causes, output_digests, run_dir_of

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SEED = 1234
OUTPUTS = {"metrics.jsonl", "weights.bin", "weights.json"}


@pytest.fixture(scope="module")
def ddp(tmp_path_factory, module_cache, base_ref) -> Path:
    proj = copy_example("torch-ddp", tmp_path_factory.mktemp("torch-ddp") / "torch-ddp", base_ref)
    build(proj)
    return proj


@pytest.fixture(scope="module")
def two_ranks(ddp) -> tuple[dict, dict]:
    return (hermetic_run(ddp, "--nproc-per-node", "2", "train.py", timeout=600)[1],
            hermetic_run(ddp, "--nproc-per-node", "2", "train.py", timeout=600)[1])


def test_two_gloo_ddp_runs_are_bitwise_identical(ddp, two_ranks):
    a, b = two_ranks
    code, d = diff_json(run_dir_of(ddp, a), run_dir_of(ddp, b))
    assert code == 0 and d["verdict"]["line"].startswith("bitwise identical (3 files and 5 metrics compared"), d["verdict"]
    da, db = output_digests(run_dir_of(ddp, a)), output_digests(run_dir_of(ddp, b))
    assert set(da) == OUTPUTS and da == db  # rank 0's outputs only


def test_the_record_holds_the_world_each_rank_and_the_backend(ddp, two_ranks):
    from hermetic.inimage.runtime import rank_seed

    rec, _ = two_ranks
    dist = rec["distributed"]
    assert (dist["world_size"], dist["nnodes"], dist["nproc_per_node"]) == (2, 1, 2)
    assert dist["backend"] == "gloo" and dist["backend_version"] == "built into torch 2.13.0+cpu"
    assert dist["rendezvous"]["backend"] == "c10d" and dist["rendezvous"]["endpoint"].startswith("127.0.0.1:")
    assert dist["env"]["GLOO_SOCKET_IFNAME"] == "lo" and dist["env"]["NCCL_ALGO"] == "Ring"
    seeds = [r["seed"] for r in dist["ranks"]]
    assert seeds == [SEED, rank_seed(SEED, 1)] and seeds[0] != seeds[1]
    for r in dist["ranks"]:
        assert r["device"] == "cpu" and r["node_rank"] == 0 and r["local_rank"] == r["rank"]
        # what each rank's runtime said it applied is what hermetic planned for it
        assert r["reported"] == {"seed": r["seed"], "device": "cpu", "backend": "gloo", "world_size": 2}, r
    run_dir = run_dir_of(ddp, rec)
    assert set(dist["logs"]) == {"0", "1"}
    rank0 = (run_dir / dist["logs"]["0"]["stderr"]).read_text()
    rank1 = (run_dir / dist["logs"]["1"]["stderr"]).read_text()
    assert "epoch 1: world 2" in rank0 and "epoch" not in rank1  # each rank's own log, kept
    assert "[default1]" in (run_dir / "logs" / "combined.log").read_text()
    assert rec["metrics"]["final"]["world_size"] == 2


def test_world_size_one_vs_two_differ_and_the_diff_names_it(ddp, two_ranks):
    _, one = hermetic_run(ddp, "--nproc-per-node", "1", "train.py", timeout=600)
    two, _ = two_ranks
    assert one["distributed"]["world_size"] == 1
    code, d = diff_json(run_dir_of(ddp, one), run_dir_of(ddp, two))
    assert code == 1
    assert d["verdict"]["line"].startswith("inputs differ: distributed (world size 1 -> 2)"), d["verdict"]
    assert d["verdict"]["causes"][0] == "distributed"
    assert set(material_causes(d)) == {"distributed"}, material_causes(d)
    assert output_digests(run_dir_of(ddp, one))["weights.bin"] != output_digests(run_dir_of(ddp, two))["weights.bin"]


def test_a_replay_runs_the_recorded_layout_again(ddp, two_ranks):
    a, _ = two_ranks
    proc = run_cli("replay", str(run_dir_of(ddp, a)), "--json", cwd=ddp, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["diff"]["verdict"]["line"].startswith("bitwise identical (")


@pytest.mark.slurm
@pytest.mark.registry
def test_two_nodes_through_slurm_meet_at_the_first_and_match_one_node(ddp, two_ranks, registry, module_cache,
                                                                      slurm_cluster, tmp_path):
    # a clone of the store to push from: the push is recorded there (pushed.json), not in the session's,
    # whose other runs of this image, beside this module under pytest-xdist, expect it never pushed
    env = {"HERMETIC_CACHE": str(clone_cache(module_cache, tmp_path / "cache"))}
    push = run_cli("push", f"{registry.host}/hermetic/torch-ddp", "-C", str(ddp), env=env, timeout=600)
    assert push.returncode == 0, push.stderr
    # -t 5: a hang (pytorch#75097) ends in minutes, not at the partition's limit
    proc = run_cli("submit", "-N", "2", "--nproc-per-node", "1", "-t", "5", "--wait", "--json", "train.py",
                   cwd=ddp, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rec = json.loads(proc.stdout)
    dist = rec["distributed"]
    assert (dist["world_size"], dist["nnodes"], dist["nproc_per_node"], dist["node_rank"]) == (2, 2, 1, 0)
    assert dist["rendezvous"]["backend"] == "static"
    assert [(r["rank"], r["node_rank"], r["local_rank"]) for r in dist["ranks"]] == [(0, 0, 0), (1, 1, 0)]
    assert rec["slurm"]["nnodes"] == 2 and rec["invocation"]["network"] == "host"
    run_dir = run_dir_of(ddp, rec)
    # the second node's container has its own record (its node, its rank's logs), inside the run's
    (node1,) = [p for p in (run_dir / "nodes").iterdir() if p.is_dir()]
    other = json.loads((node1 / "run.json").read_text())
    assert other["distributed"]["node_rank"] == 1 and other["slurm"]["node_rank"] == 1
    assert {rec["slurm"]["node"], other["slurm"]["node"]} == set(slurm_cluster.nodes)
    assert "1" in other["distributed"]["logs"] and "0" in dist["logs"]
    # two processes on two nodes, or on one: the same all-reduce, the same bits
    one_node, _ = two_ranks
    assert output_digests(run_dir) == output_digests(run_dir_of(ddp, one_node))
    code, d = diff_json(run_dir_of(ddp, one_node), run_dir)
    assert "distributed (nodes 1 -> 2" in d["verdict"]["line"], d["verdict"]
    assert d["verdict"]["line"].endswith("outputs bitwise identical all the same"), d["verdict"]
