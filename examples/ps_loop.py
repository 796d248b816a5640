# The parameter server in your own loop: torchrun --standalone --nproc-per-node 3 examples/ps_loop.py
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ringps.ps import RemoteOptimizer, is_server, serve

dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
if is_server(servers=1):  # the last rank holds the parameters and applies the policy
    print(serve(model, policy="threshold", staleness_threshold=2))
else:
    opt = RemoteOptimizer(model, lr=0.1, policy="threshold", staleness_threshold=2)
    w = torch.randn(20, 4, generator=torch.Generator().manual_seed(0))  # the task: argmax of x @ w
    for step in range(200):
        x = torch.randn(32, 20)
        opt.zero_grad()
        F.cross_entropy(model(x), (x @ w).argmax(1)).backward()
        opt.step()
    x = torch.randn(1000, 20)
    print(f"rank {dist.get_rank()}: accuracy {(model(x).argmax(1) == (x @ w).argmax(1)).float().mean():.2f}")
    opt.close()
dist.destroy_process_group()
