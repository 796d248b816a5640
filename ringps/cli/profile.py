"""`ringps profile`: measure a model's per-layer profile here and save it for `ringps simulate`.

    ringps profile --model facenet --out facenet.yaml
    ringps profile --model resnet-small --dataset fashion-mnist --device cuda --out resnet-small-gpu.yaml

`--device cuda` times the model, its optimizer step and the device's kernel rates on the GPU, each
after its kernels have run (ringps.schedule.profile), so the profile stands for a GPU worker.
"""

from __future__ import annotations

import argparse

from ringps.config import validate
from ringps.malloc import keep_freed_memory

HELP = "measure a model's per-layer step profile (YAML for ringps simulate)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="facenet")
    p.add_argument("--dataset", default="orl-faces")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps-to-target", type=float, help="dense synchronous steps to the target accuracy, if known")
    p.add_argument("--device", default="cpu", help="where to time it: cpu (one thread, as a worker here), cuda or cuda:N")
    p.add_argument("--out", required=True)


def profile_device(name: str):
    """`--device` as a torch device that is here, or a ConfigError saying what to do."""
    import torch

    from ringps.errors import ConfigError

    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"--device {name}: not a device; use cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {name}: ringps profiles on cpu or cuda")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: no CUDA device here (torch.cuda.is_available() is False); run "
                              "`ringps profile` on the GPU machine, or profile with --device cpu")
        if (dev.index or 0) >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def run(args: argparse.Namespace) -> int:
    import platform

    import torch

    from ringps.comm.probe import device_rates
    from ringps.data import load_dataset
    from ringps.data.loader import ShardedLoader
    from ringps.models import build_model
    from ringps.schedule.profile import profile_model
    from ringps.sim.workload import Kernels, from_profile

    cfg = validate({"dataset": args.dataset, "model": args.model, "batch_size": args.batch_size})
    dev = profile_device(args.device)
    torch.set_num_threads(1)
    keep_freed_memory()  # as the workers whose compute this stands for
    data = load_dataset(cfg.data)
    torch.manual_seed(0)
    model = build_model(args.model, data.shape, data.num_classes).to(dev)
    batch = next(iter(ShardedLoader(data.train, 0, 1, args.batch_size, 0).epoch(0)))
    prof = profile_model(model, batch.inputs.to(dev), batch.targets.to(dev), reps=5)
    gb_s, tflops = device_rates(device=dev)  # what the strategies' own work costs on this device scales with
    host = (torch.cuda.get_device_name(dev) if dev.type == "cuda"
            else f"{platform.processor() or platform.machine()}, 1 thread")
    w = from_profile(prof, f"{args.model} on {args.dataset}", host,
                     args.steps_to_target, samples=len(data.train.images),
                     kernels=Kernels(source="measured by ringps profile (ringps.comm.probe.device_rates)",
                                     memory_gb_s=round(gb_s, 1), fp32_tflops=round(tflops, 4)))
    w.save(args.out)
    print(f"{args.out}: {len(w.layers)} layers, {w.params / 1e6:.2f} M parameters, {w.compute_s * 1e3:.1f} ms per step "
          f"(forward and backward) and the optimizer's step, {w.optimizer_s * 1e3:.1f} ms; memory {gb_s:.1f} GB/s, "
          f"{tflops:.3f} TFLOPS")
    return 0
