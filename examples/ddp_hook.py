# ring-topk in your own DDP loop: torchrun --standalone --nproc-per-node 2 examples/ddp_hook.py
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ringps.malloc import keep_freed_memory

keep_freed_memory()  # on CPU: freed tensors stay for the next step instead of faulting back (README)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.ReLU(), torch.nn.Linear(1000, 10))  # 1M entries
# --- the README's snippet ---
from ringps.hooks import RingTopkState, ring_topk_hook  # noqa: E402

ddp = torch.nn.parallel.DistributedDataParallel(model)
state = RingTopkState(density=0.01, exchange="auto", warmup_steps=100).bind(model)
ddp.register_comm_hook(state, ring_topk_hook)
# --- end ---
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
    x = torch.randn(32, 1000)
    opt.zero_grad()
    F.cross_entropy(ddp(x), x[:, :10].argmax(1)).backward()
    opt.step()
checkpoint = state.state_dict(all_ranks=True)  # every rank's residuals (a collective)
if dist.get_rank() == 0:
    print(state.summary())
    torch.save(checkpoint, sys.argv[2]) if len(sys.argv) > 2 else None
dist.destroy_process_group()
# End without the interpreter's teardown: with gloo, torch 2.13 at times aborts there ("terminate
# called without an active exception", SIGABRT: plain DDP, no hook, 2 of 25 runs here) after a run
# that succeeded, and torchrun reports a failed rank. ringps's own workers end the same way.
sys.stdout.flush()
os._exit(0)
