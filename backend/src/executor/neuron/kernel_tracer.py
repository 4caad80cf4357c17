#!/usr/bin/env python3
"""Traces Neuron SDK kernels for burn-trainium's `neuron` executor.

Reads a kernel request (JSON written by the lowering: kernel, grid, inputs, outputs, arguments)
on standard input and writes, on standard output, the `AwsNeuronCustomNativeKernel` call the
SDK's NKI tracer makes of it (JSON: custom_call_target, backend_config, outputs). With `--probe`
it traces a small request and says on standard error why that fails, if it does.

The kernels: `flash_fwd` (inference: the output; training: the output and the log-sum-exp
statistics) and `flash_attn_bwd` (the query, key and value gradients), called with their
compile-time arguments by name and no dropout seed. A sliding window is passed only when there
is one, so that SDKs whose kernels predate the argument still trace the others.

Written against the NKI frontend of neuronx-cc (`neuronxcc.nki`) and the flash kernels'
published interfaces, without access to the SDK: it has never been run against it. The
project's tests replace it by a stand-in.
"""

import argparse
import json
import os
import sys

KERNELS = ("flash_fwd", "flash_attn_bwd")

# What `--probe` traces: one batch row, one head of width 64, 512 positions, in f32.
PROBE_REQUEST = {
    "kernel": "flash_fwd",
    "grid": [1, 1],
    "inputs": [
        {"dtype": "float32", "shape": [1, 1, 64, 512]},
        {"dtype": "float32", "shape": [1, 1, 64, 512]},
        {"dtype": "float32", "shape": [1, 1, 512, 64]},
    ],
    "outputs": [{"dtype": "float32", "shape": [1, 1, 512, 64]}],
    "arguments": {
        "softmax_scale": 0.125,
        "use_causal_mask": True,
        "mixed_precision": False,
        "seq_tile_size": 512,
        "training": False,
    },
}


def import_sdk():
    """The SDK pieces the tracer needs: the flash kernels, their configuration, the kernel class."""
    from neuronxcc.nki.compiler.backends.neuron.FrameworkKernel import UnifiedKernel
    from neuronxcc.nki.kernels.attention import FlashConfig, flash_attn_bwd, flash_fwd

    kernels = {"flash_fwd": flash_fwd, "flash_attn_bwd": flash_attn_bwd}
    return kernels, FlashConfig, UnifiedKernel


def numpy_dtype(name):
    import numpy

    if name == "bfloat16":
        import ml_dtypes

        return numpy.dtype(ml_dtypes.bfloat16)
    return numpy.dtype(name)


def array_kernel_class(unified_kernel):
    """A kernel class of the SDK that takes NumPy arrays as the framework's tensors."""
    import numpy

    class ArrayKernel(unified_kernel):
        def translate_to_neuron_dtype(self, dtype):
            return dtype

        def is_framework_tensor(self, tensor):
            return isinstance(tensor, numpy.ndarray)

        def map_framework_tensor(self, tensor):
            return tensor.shape, tensor.dtype

    return ArrayKernel


def window(arguments):
    """The sliding window argument, only when the request has a window."""
    size = arguments.get("sliding_window", -1)
    return {"sliding_window": size} if size > 0 else {}


def bound_kernel(kernels, flash_config, request):
    """The requested kernel with its compile-time arguments bound, taking the request's inputs
    in order; no dropout seed (`None`)."""
    name = request["kernel"]
    arguments = request["arguments"]
    kernel = getattr(kernels[name], "func", kernels[name])
    if name == "flash_fwd":
        config = flash_config(
            seq_tile_size=arguments["seq_tile_size"], training=arguments["training"]
        )

        def flash_attention(q, k, v):
            return kernel(
                q,
                k,
                v,
                None,
                softmax_scale=arguments["softmax_scale"],
                use_causal_mask=arguments["use_causal_mask"],
                mixed_precision=arguments["mixed_precision"],
                config=config,
                **window(arguments),
            )

        return flash_attention

    def flash_attention_backward(q, k, v, o, dy, lse):
        return kernel(
            q,
            k,
            v,
            o,
            dy,
            lse,
            None,
            use_causal_mask=arguments["use_causal_mask"],
            mixed_precision=arguments["mixed_precision"],
            softmax_scale=arguments["softmax_scale"],
            **window(arguments),
        )

    return flash_attention_backward


def trace(request, target):
    import numpy

    if request["kernel"] not in KERNELS:
        raise ValueError(f"unknown kernel {request['kernel']!r} (known: {', '.join(KERNELS)})")
    kernels, flash_config, unified_kernel = import_sdk()
    function = bound_kernel(kernels, flash_config, request)
    traced = array_kernel_class(unified_kernel).trace(
        function,
        grid=tuple(request["grid"]),
        kernel_return=True,
        enable_cache=False,
        platform_target=target,
    )
    operands = [
        numpy.zeros(tensor["shape"], dtype=numpy_dtype(tensor["dtype"]))
        for tensor in request["inputs"]
    ]
    config = traced.dump_config(*operands)
    if getattr(config, "constant_values", None):
        raise ValueError("the traced kernel takes constant operands, which burn-trainium does not pass")
    if getattr(config, "operand_output_aliases", None):
        raise ValueError("the traced kernel writes into an operand, which burn-trainium does not expect")
    returned = list(config.return_types)
    if len(returned) != len(request["outputs"]):
        raise ValueError(
            f"the traced kernel returns {len(returned)} tensors, expected {len(request['outputs'])}"
        )
    backend_config = config.dumped_config
    if isinstance(backend_config, bytes):
        backend_config = backend_config.decode("ascii")
    return {
        "custom_call_target": "AwsNeuronCustomNativeKernel",
        "backend_config": backend_config,
        "outputs": [
            {"dtype": numpy.dtype(dtype).name, "shape": [int(size) for size in shape]}
            for dtype, shape in returned
        ],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", action="store_true", help="trace a small request, print nothing")
    parser.add_argument("--target", default="trn1", help="trn1 or trn2")
    options = parser.parse_args()
    try:
        import_sdk()
    except ImportError as error:
        print(f"the Neuron SDK's NKI kernels do not import: {error}", file=sys.stderr)
        return 1
    # Whatever the SDK prints goes to standard error: standard output holds the answer alone.
    answer_stream = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        request = PROBE_REQUEST if options.probe else json.load(sys.stdin)
        call = trace(request, options.target)
    except Exception as error:  # every failure is reported to the executor, with its type
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    if not options.probe:
        json.dump(call, answer_stream)
    answer_stream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
