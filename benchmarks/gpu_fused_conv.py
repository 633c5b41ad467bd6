"""Whether cuDNN's fused convolution ops cut GPU ResNet-18's host-bound call (issue 29, item 3), measured before
building it into shimgen.

    python benchmarks/gpu_fused_conv.py

GPU ResNet-18 at batch 1 is bound by the host: 20 cuDNN convolutions (about 15 µs of host each) and 19 Triton
kernels that add each convolution's bias, the residual and the ReLU (about 5 µs each). ATen has two ops that do the
convolution, bias, residual add and ReLU in one cuDNN call (`cudnn_convolution_relu`, `cudnn_convolution_add_relu`,
which TorchScript's frozen inference fuses into). This builds torchvision's ResNet-18 with AOTInductor (freezing) twice:
as is, and with an Inductor post-grad pass that rewrites relu(conv(x) [+ z]) into those ops (they run through
AOTInductor's proxy executor: no C shim). Then µs per call, host µs, kernels per call and the error against eager.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

aten = torch.ops.aten
_lib = torch.library.Library("aten", "IMPL")


def _conv_meta(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: Any) -> Any:
    return aten.convolution.default(x, w, bias, stride, padding, dilation, False, [0] * len(stride), groups)


def _conv_relu_meta(x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: Any) -> Any:
    return _conv_meta(x, w, bias, stride, padding, dilation, groups)


def _conv_add_relu_meta(
    x: Any, w: Any, z: Any, alpha: Any, bias: Any, stride: Any, padding: Any, dilation: Any, groups: Any
) -> Any:
    return _conv_meta(x, w, bias, stride, padding, dilation, groups)


_lib.impl("cudnn_convolution_relu", _conv_relu_meta, "Meta")
_lib.impl("cudnn_convolution_add_relu", _conv_add_relu_meta, "Meta")


def _fusable_conv(node: Any) -> bool:
    if node.op != "call_function" or node.target is not aten.convolution.default or len(node.users) != 1:
        return False
    x, w, _bias, _stride, _padding, _dilation, transposed, _output_padding, _groups = node.args
    val = node.meta.get("val")
    return (
        not transposed
        and val is not None
        and val.dim() == 4
        and val.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and val.is_cuda
    )


class FuseConvRelu(CustomGraphPass):
    fused: dict[str, int] = {"conv_relu": 0, "conv_add_relu": 0}

    def __call__(self, graph: torch.fx.Graph) -> None:
        for relu in list(graph.nodes):
            if relu.op != "call_function" or relu.target is not aten.relu.default:
                continue
            (source,) = relu.args
            conv, z = None, None
            if _fusable_conv(source):
                conv = source
            elif (
                source.op == "call_function"
                and source.target is aten.add.Tensor
                and len(source.users) == 1
                and not source.kwargs
            ):
                a, b = source.args
                for candidate, other in ((a, b), (b, a)):
                    if (
                        isinstance(candidate, torch.fx.Node)
                        and _fusable_conv(candidate)
                        and isinstance(other, torch.fx.Node)
                        and other.meta.get("val") is not None
                        and other.meta["val"].shape == candidate.meta["val"].shape
                        and other.meta["val"].dtype == candidate.meta["val"].dtype
                    ):
                        conv, z = candidate, other
                        break
            if conv is None:
                continue
            x, w, bias, stride, padding, dilation, _t, _o, groups = conv.args
            with graph.inserting_before(relu):
                if z is None:
                    fused = graph.call_function(
                        aten.cudnn_convolution_relu.default, (x, w, bias, stride, padding, dilation, groups)
                    )
                    self.fused["conv_relu"] += 1
                else:
                    fused = graph.call_function(
                        aten.cudnn_convolution_add_relu.default,
                        (x, w, z, 1.0, bias, stride, padding, dilation, groups),
                    )
                    self.fused["conv_add_relu"] += 1
            val = relu.meta["val"]
            with val.fake_mode:
                fused.meta["val"] = fused.target(
                    *[a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in fused.args]
                )
            relu.replace_all_uses_with(fused)
            graph.erase_node(relu)
            if source is not conv:
                graph.erase_node(source)
            graph.erase_node(conv)
        graph.lint()

    def uuid(self) -> bytes:
        return b"shimgen-fuse-conv-relu-1"


def host_and_call_us(fn: Any, calls: int = 300, blocks: int = 9) -> tuple[float, float]:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    per_call, host = [], []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        per_call.append((time.perf_counter() - start) / calls * 1e6)
        samples = []
        for _ in range(50):
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t) * 1e6)
        host.append(statistics.median(samples))
    return statistics.median(per_call), statistics.median(host)


def kernels_per_call(fn: Any, calls: int = 20) -> tuple[float, float, list[str]]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(e.device_time for e in kernels) / calls
    names = sorted({e.name[:60] for e in kernels})
    return len(kernels) / calls, gpu_us, names


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "projects"))
    from models.resnet import resnet18

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    torch.manual_seed(0)
    model = resnet18(num_classes=1000).eval().cuda()
    x = torch.randn(1, 3, 224, 224, device="cuda")
    with torch.no_grad():
        want = model(x)
        program = torch.export.export(model, (x,))
    runs: dict[str, Any] = {}
    torch._inductor.config.force_disable_caches = True
    with tempfile.TemporaryDirectory() as tmp:
        for name, configs in (
            ("AOTI", {"freezing": True}),
            ("AOTI + fused cuDNN", {"freezing": True, "post_grad_custom_post_pass": FuseConvRelu()}),
        ):
            start = time.perf_counter()
            with torch.no_grad():  # freezing folds batch norm into the convolutions only without grad
                path = torch._inductor.aoti_compile_and_package(
                    program, package_path=f"{tmp}/{len(runs)}.pt2", inductor_configs=configs
                )
            loader = torch._inductor.aoti_load_package(path).loader
            print(f"{name}: built in {time.perf_counter() - start:.1f} s")
            runs[name] = loader
        print("fused:", FuseConvRelu.fused)
        print("\n| build | µs per call | host µs | kernels per call | GPU µs | max abs error vs eager |")
        print("| --- | --- | --- | --- | --- | --- |")
        for _round in range(3):
            for name, loader in runs.items():
                with torch.no_grad():
                    (got,) = loader.run([x])
                    fn = lambda loader=loader: loader.run([x])  # noqa: E731
                    us, host = host_and_call_us(fn)
                    count, gpu, names = kernels_per_call(fn)
                print(
                    f"| {name} | {us:.1f} | {host:.1f} | {count:.0f} | {gpu:.1f} | {(got - want).abs().max().item():.2e} |"
                )
                if _round == 2:
                    print("   kernels:", "; ".join(names))


if __name__ == "__main__":
    main()
