"""`harness feed` with a real accelerator: ResNet-50 (or, with ``--model resnet18``, a model
whose step outruns the servers, so the figure measures the loader) training steps on a GPU
fed three ways.

* ``synthetic``: batches already on the GPU (the ceiling: the GPU never waits);
* ``pushdown``: ``pushdown.Loader`` with default options against a ``pushdown serve`` on
  the same host (its cores given by the caller, e.g. pinned with taskset), the pipeline
  ``decode_resize(image,128,128) → select [pixels,label] → random_flip → shuffle 4096 →
  batch 256``;
* ``dataloader``: ``torch.utils.data.DataLoader`` with ``--workers`` processes decoding with
  PIL on the trainer's cores (``bench_feed.py``'s workers).

With ``--recipe``, the feeds run torchvision's train recipe at 224 px instead
(``bench_recipe.py``'s): ``pushdown`` has the server send JPEGs of at most 320 px and the
loader's threads crop, flip and normalize into NCHW bfloat16; ``dataloader`` decodes, crops,
flips and normalizes with PIL and numpy in its workers (NCHW float32).

Each step: uint8 NHWC → float, normalized (a recipe's batches come normalized), channels_last,
bf16 autocast, SGD. Reports one
JSON line per feed: images/s, the share of the run the trainer waited for data (1 − GPU busy,
measured around a synchronized step), the trainer's CPU seconds per 1,000 images (this
process and its children) and the server's (``--server-pid``); with ``--server-cores``, the
servers' capacity (those cores at the server's measured CPU per image) and the share of it
delivered.

    python bench_feed_gpu.py --feed pushdown --server http://127.0.0.1:50051 --server-pid PID
    python bench_feed_gpu.py --feed dataloader --data DIR/images --workers 8
"""

import argparse
import json
import os
import resource
import sys
import time

import numpy as np
import torch

B = 256


def model_named(name):
    try:
        import torchvision

        return getattr(torchvision.models, name)(num_classes=1000)
    except ImportError:
        return _resnet(bottleneck=name == "resnet50")


def _resnet(bottleneck):
    """ResNet-50 (bottleneck blocks 3-4-6-3) or ResNet-18 (basic blocks 2-2-2-2) in plain
    torch, for hosts without torchvision."""
    nn = torch.nn

    class Residual(nn.Module):
        def __init__(self, body, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(*body)
            self.skip = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    def block(cin, width, stride):
        """One residual block and its output channels."""
        if bottleneck:
            cout = width * 4
            body = [
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout),
            ]
        else:
            cout = width
            body = [
                nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
            ]
        return Residual(body, cin, cout, stride), cout

    stages = [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)] if bottleneck else \
        [(64, 2, 1), (128, 2, 2), (256, 2, 2), (512, 2, 2)]
    layers, cin = [], 64
    for width, blocks, stride in stages:
        for i in range(blocks):
            layer, cin = block(cin, width, stride if i == 0 else 1)
            layers.append(layer)
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1),
        *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000),
    )


def cpu_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu():
    """This process, its children reaped, and its children alive (DataLoader workers)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
    me = os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def pushdown_batches(server, epochs):
    import pushdown

    pipeline = {
        "dataset": "images",
        "steps": [
            {"op": "map", "call": "decode_resize", "input": "image", "params": [128, 128], "output": "pixels"},
            {"op": "select", "columns": ["pixels", "label"]},
            {"op": "map", "call": "random_flip", "input": "pixels", "params": [0.5]},
            {"op": "shuffle", "buffer": 4096},
            {"op": "batch", "size": B},
        ],
    }
    loader = pushdown.Loader(server, pipeline=pipeline, seed=1, epochs=epochs)
    for b in loader:
        yield torch.from_numpy(b["pixels"]), torch.from_numpy(b["label"].astype(np.int64))
    pushdown_batches.stats = loader.stats


def recipe_batches(feed, server, data, workers, epochs):
    """The train recipe at 224 px: NCHW tensors, normalized."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_recipe

    if feed == "pushdown":
        source = bench_recipe.pushdown_batches(server, 224, 320, B, dtype="bfloat16", epochs=epochs)
    else:
        source = (b for _ in range(epochs) for b in bench_recipe.dataloader(data, workers, 224, B))
    for x, y in source:
        if isinstance(x, str):  # the sources' (name, handle) heading
            continue
        if not isinstance(x, torch.Tensor) and x.dtype.name in ("uint16", "bfloat16"):  # bfloat16 bits
            x = torch.from_numpy(np.asarray(x).view(np.int16)).view(torch.bfloat16)
        yield torch.as_tensor(x), torch.as_tensor(np.asarray(y)).long()


def dataloader_batches(data, workers, epochs):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_feed

    units = bench_feed.row_groups(data)
    for pixels, labels in bench_feed.torch_epochs(units, workers, epochs, 1):
        yield pixels, labels.long()


def train(batches, model, opt, device, max_steps, warmup, server_pid):
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    loss_fn = torch.nn.CrossEntropyLoss()
    images, waited, steps, start = 0, 0.0, 0, None
    it = iter(batches)
    while steps < max_steps + warmup:
        asked = time.perf_counter()
        b = next(it, None)
        if b is None:
            break
        if steps == warmup:
            start, images, waited = time.perf_counter(), 0, 0.0
            cpu0 = own_cpu()
            server0 = cpu_of(server_pid) if server_pid else None
        elif steps > warmup:
            waited += time.perf_counter() - asked
        pixels, labels = b
        if pixels.dtype.is_floating_point:  # a recipe's: NCHW, normalized
            x = pixels.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        else:
            x = pixels.to(device, non_blocking=True).permute(0, 3, 1, 2).float()
            x = ((x - mean) / std).contiguous(memory_format=torch.channels_last)
        y = (labels % 1000).to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        steps += 1
        if steps > warmup:
            images += len(labels)
    elapsed = time.perf_counter() - start
    server = cpu_of(server_pid) - server0 if server_pid else None
    return images, elapsed, waited, own_cpu() - cpu0, server


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--feed", choices=["synthetic", "pushdown", "dataloader"], required=True)
    ap.add_argument("--server")
    ap.add_argument("--server-pid", type=int)
    ap.add_argument("--data")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--recipe", action="store_true", help="torchvision's train recipe at 224 px")
    ap.add_argument("--model", choices=["resnet50", "resnet18"], default="resnet50")
    ap.add_argument("--server-cores", type=int, help="the cores the server runs on (its capacity)")
    args = ap.parse_args()

    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    model = model_named(args.model).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    side = 224 if args.recipe else 128
    if args.feed == "synthetic":
        x = torch.randint(0, 255, (B, side, side, 3), dtype=torch.uint8, device=device)
        y = torch.randint(0, 1000, (B,), device=device)
        batches = iter(lambda: (x, y), None)
    elif args.recipe:
        batches = recipe_batches(args.feed, args.server, args.data, args.workers, args.epochs)
    elif args.feed == "pushdown":
        batches = pushdown_batches(args.server, args.epochs)
    else:
        batches = dataloader_batches(args.data, args.workers, args.epochs)
    images, elapsed, waited, cpu, server = train(
        batches, model, opt, device, args.steps, args.warmup, args.server_pid
    )
    capacity = (
        args.server_cores * 1000 / (server / images * 1000)
        if server and args.server_cores and images
        else None
    )
    out = {
        "feed": args.feed,
        "model": args.model,
        "trainer_cores": len(os.sched_getaffinity(0)),
        "recipe": "train-224" if args.recipe else None,
        "workers": args.workers if args.feed == "dataloader" else None,
        "images": images,
        "images_per_s": images / elapsed,
        "wait": waited / elapsed,
        "trainer_cpu_s_per_1k": cpu / images * 1000,
        "server_cpu_s_per_1k": server / images * 1000 if server is not None else None,
        "server_capacity_per_s": capacity,
        "share_of_server_capacity": images / elapsed / capacity if capacity else None,
        "gpu": torch.cuda.get_device_name(),
    }
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
