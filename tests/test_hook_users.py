"""The ring-topk hook in users' hands: the README's snippet as written (auto measures the job's
own links and compute), a state built before the process group or never bound or pickled into
the workers, and a checkpoint of every rank's residuals that only rank 0 writes."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from conftest import run_ranks
from torch.nn.parallel import DistributedDataParallel as DDP

from ringps.launch import cluster as cl

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_hook.py"


def readme_snippet() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### ring-topk in your own DDP loop"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_example_runs_the_readme_snippet_unchanged():
    code = [line for line in readme_snippet().splitlines() if line and not line.startswith("#")]
    example = EXAMPLE.read_text()
    snippet = example[example.index("# --- the README's snippet ---"):example.index("# --- end ---")]
    assert [line.split("  # noqa")[0] for line in snippet.splitlines()[1:] if line] == code


def chosen(stdout: str) -> str:
    line = next(l for l in stdout.splitlines() if l.startswith("links "))
    return re.search(r"k=[\d,]+: (\S+) \(", line).group(1)


@pytest.mark.slow
def test_auto_stays_dense_on_loopback():
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(EXAMPLE), "8"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    # whole buckets: in fp32 or, where the model prices the halved bytes above the casts, fp16
    assert chosen(r.stdout) in ("dense", "dense-fp16"), r.stdout


@pytest.mark.slow
@pytest.mark.net
@pytest.mark.skipif(cl.requirements_missing() is not None, reason=str(cl.requirements_missing()))
def test_auto_goes_sparse_on_a_100mbit_link_without_a_cost_argument(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    with cl.Cluster.create([100e6, 100e6]) as c:
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}
        procs = [subprocess.Popen(c.exec_prefix(node) + [torchrun, "--nnodes", "2", "--node-rank", str(node),
                                                        "--nproc-per-node", "1", "--master-addr", c.addr(0),
                                                        "--master-port", "29517", str(EXAMPLE), "6"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for node in (0, 1)]
        logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), logs[0][-3000:]
    assert chosen(logs[0]) in ("shared-index", "allgather", "sparse-rs"), logs[0][-2000:]
    assert "Mbit/s per link" in logs[0]


class Lin(nn.Module):
    def __init__(self):
        super().__init__()
        self.big, self.small = nn.Linear(64, 64), nn.Linear(64, 4)

    def forward(self, x):
        return self.small(torch.relu(self.big(x)))


def steps(ddp, opt, rank, start, n):
    for t in range(start, start + n):
        g = torch.Generator().manual_seed(100 * rank + t)
        x = torch.randn(8, 64, generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), x[:, :4].argmax(1)).backward()
        opt.step()


def checkpointed(rank, world, path: str, mode: str):
    from ringps.hooks import RingTopkState, ring_topk_hook

    torch.manual_seed(0)
    model = Lin()
    state = RingTopkState(density=0.05, exchange="allgather", dense_below=1000, clip_norm=0.5, selector="topk")
    if mode == "pickled":  # what a spawning framework does with the state it was given
        state = pickle.loads(pickle.dumps(state))
    ddp = DDP(model)
    ddp.register_comm_hook(state, ring_topk_hook)  # never bound: names come from the DDP module at first use
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if mode == "resume":
        saved = torch.load(path, weights_only=False)  # rank 0's file: every rank's part is in it
        model.load_state_dict(saved["model"][rank])
        opt.load_state_dict(saved["opt"][rank])
        state.load_state_dict(saved["hook"])
        steps(ddp, opt, rank, 4, 4)
    else:
        steps(ddp, opt, rank, 0, 4)
        hook = state.state_dict(all_ranks=True)  # a collective: every rank calls it
        every = [None] * world
        torch.distributed.all_gather_object(every, (model.state_dict(), opt.state_dict()))
        if rank == 0:
            torch.save({"hook": hook, "model": [m for m, _ in every], "opt": [o for _, o in every]}, path)
        steps(ddp, opt, rank, 4, 4)
    state.close()
    return [p.detach().clone() for p in model.parameters()], sorted(state.memory.buffers), state.memory.workers


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bound-late", "pickled"])
def test_one_checkpoint_of_every_rank_resumes_bitwise(tmp_path, mode):
    path = str(tmp_path / "ckpt.pt")
    first = run_ranks(checkpointed, 2, (path, mode))
    resumed = run_ranks(checkpointed, 2, (path, "resume"))
    for (a, names, workers), (b, _, _) in zip(first, resumed):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert names == ["big.weight"] and workers == 2  # keyed by name; clipping knows the world size
