#!/usr/bin/env python3
"""Traces Neuron SDK kernels for burn-trainium's `neuron` executor.

Reads a kernel request (JSON written by the lowering: kernel, grid, inputs, output, arguments)
on standard input and writes, on standard output, the `AwsNeuronCustomNativeKernel` call the
SDK's NKI tracer makes of it (JSON: custom_call_target, backend_config, output). With `--probe`
it only checks that the SDK's kernels import, and says why not on standard error.

Written against the NKI frontend of neuronx-cc (`neuronxcc.nki`, the one jax-neuronx and
torch-neuronx trace kernels with). The project's tests replace this script by a stand-in: it has
not been run against the SDK by them.
"""

import argparse
import json
import sys

KERNELS = ("flash_fwd",)


def import_sdk():
    """The SDK pieces the tracer needs: the flash kernel, its configuration, the kernel class."""
    from neuronxcc.nki.compiler.backends.neuron.FrameworkKernel import UnifiedKernel
    from neuronxcc.nki.kernels.attention import FlashConfig, flash_fwd

    return flash_fwd, FlashConfig, UnifiedKernel


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


def flash_forward(flash_fwd, flash_config, arguments):
    """The flash kernel with its compile-time arguments bound, taking (q, k, v, seed)."""
    kernel = getattr(flash_fwd, "func", flash_fwd)
    config = flash_config(
        seq_tile_size=arguments["seq_tile_size"], training=arguments["training"]
    )

    def flash_attention(q, k, v, seed):
        return kernel(
            q,
            k,
            v,
            seed,
            softmax_scale=arguments["softmax_scale"],
            use_causal_mask=arguments["use_causal_mask"],
            mixed_precision=arguments["mixed_precision"],
            config=config,
        )

    return flash_attention


def trace(request, target):
    import numpy

    if request["kernel"] not in KERNELS:
        raise ValueError(f"unknown kernel {request['kernel']!r} (known: {', '.join(KERNELS)})")
    flash_fwd, flash_config, unified_kernel = import_sdk()
    function = flash_forward(flash_fwd, flash_config, request["arguments"])
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
    if len(returned) != 1:
        raise ValueError(f"the traced kernel returns {len(returned)} tensors, expected one")
    dtype, shape = returned[0]
    backend_config = config.dumped_config
    if isinstance(backend_config, bytes):
        backend_config = backend_config.decode("ascii")
    return {
        "custom_call_target": "AwsNeuronCustomNativeKernel",
        "backend_config": backend_config,
        "output": {"dtype": numpy.dtype(dtype).name, "shape": [int(size) for size in shape]},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", action="store_true", help="only check that the SDK imports")
    parser.add_argument("--target", default="trn1", help="trn1 or trn2")
    options = parser.parse_args()
    try:
        import_sdk()
    except ImportError as error:
        print(f"the Neuron SDK's NKI kernels do not import: {error}", file=sys.stderr)
        return 1
    if options.probe:
        return 0
    try:
        request = json.load(sys.stdin)
        json.dump(trace(request, options.target), sys.stdout)
    except Exception as error:  # every failure is reported to the executor, with its type
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
