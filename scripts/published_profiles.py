"""Write the shipped profiles of published models (ringps/sim/profiles/*.yaml): per-layer parameters
and FLOPs of ResNet-50, ResNet-101 and VGG-16 at 224x224, and a per-step time from a publication,
split over the layers in proportion to their FLOPs. Run once; the YAML files are committed.

    .venv/bin/python scripts/published_profiles.py
"""

from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[1] / "ringps" / "sim" / "profiles"
TF_BENCH = ("TensorFlow performance benchmarks (tensorflow/docs site/en/r1/guide/performance/benchmarks.md, "
            "tf_cnn_benchmarks, May 2017)")


def conv(name, cin, cout, k, hw_out, kind="conv"):
    return {"name": name, "kind": kind, "params": cin * cout * k * k, "flops": 2.0 * cin * cout * k * k * hw_out * hw_out}


def bn(name, c, hw):
    return {"name": name, "kind": "other", "params": 2 * c, "flops": 4.0 * c * hw * hw}


def resnet(blocks):
    layers = [conv("conv1", 3, 64, 7, 112), bn("bn1", 64, 112)]
    cin, hw = 64, 56
    for stage, (n, width) in enumerate(zip(blocks, (64, 128, 256, 512))):
        for b in range(n):
            out = 4 * width
            hw_o = hw // 2 if (b == 0 and stage > 0) else hw
            p = f"layer{stage + 1}.{b}"
            layers += [conv(f"{p}.conv1", cin, width, 1, hw), bn(f"{p}.bn1", width, hw),
                       conv(f"{p}.conv2", width, width, 3, hw_o), bn(f"{p}.bn2", width, hw_o),
                       conv(f"{p}.conv3", width, out, 1, hw_o), bn(f"{p}.bn3", out, hw_o)]
            if b == 0:
                layers += [conv(f"{p}.downsample", cin, out, 1, hw_o), bn(f"{p}.downsample.bn", out, hw_o)]
            cin, hw = out, hw_o
    layers.append({"name": "fc", "kind": "fc", "params": 2048 * 1000 + 1000, "flops": 2.0 * 2048 * 1000,
                   "in_features": 2048, "out_features": 1000})
    return layers


def vgg16():
    cfg = [(3, 64, 224), (64, 64, 224), (64, 128, 112), (128, 128, 112), (128, 256, 56), (256, 256, 56), (256, 256, 56),
           (256, 512, 28), (512, 512, 28), (512, 512, 28), (512, 512, 14), (512, 512, 14), (512, 512, 14)]
    layers = [dict(conv(f"conv{i}", a, b, 3, hw), params=a * b * 9 + b) for i, (a, b, hw) in enumerate(cfg)]
    for name, a, b in (("fc6", 25088, 4096), ("fc7", 4096, 4096), ("fc8", 4096, 1000)):
        layers.append({"name": name, "kind": "fc", "params": a * b + b, "flops": 2.0 * a * b, "in_features": a,
                       "out_features": b})
    return layers


def write(name, device, source, batch, step_s, layers):
    doc = {"name": name, "device": device, "source": source, "batch": batch, "step_s": step_s, "layers": layers}
    (OUT / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    print(name, f"{sum(l['params'] for l in layers) / 1e6:.1f} M parameters, {step_s:.3f} s per step")


if __name__ == "__main__":
    write("resnet50-k80", "NVIDIA Tesla K80 (one GPU of a p2.8xlarge)",
          f"{TF_BENCH}: ResNet-50, batch 64, 1 GPU, synthetic data: 52.4 images/s -> 64 / 52.4 s per step", 64,
          64 / 52.4, resnet([3, 4, 6, 3]))
    write("vgg16-p100", "NVIDIA Tesla P100 (DGX-1)",
          f"{TF_BENCH}: VGG16, batch 64, 1 GPU, synthetic data: 154 images/s -> 64 / 154 s per step", 64, 64 / 154,
          vgg16())
    write("resnet101-p100", "NVIDIA Tesla P100 (DGX-1)",
          f"{TF_BENCH}: ResNet-152, batch 64, 1 GPU: 91.8 images/s; ResNet-101's step taken as ResNet-152's x "
          "their forward FLOPs (7.8 / 11.5 GFLOPs per image): a derived figure, the table has no ResNet-101", 64,
          64 / 91.8 * 7.8 / 11.5, resnet([3, 4, 23, 3]))
