"""float32 matrix products on this CPU: torch's default kernel (MKL) against oneDNN, the candidates among which
`VaswaniLinear` chooses by measurement (vaswani_hf/kernels.py).

The shapes are those of transformer-base (or of the sizes given): a training step (64 x 32 tokens = 2,048 rows)
and decoding steps (16 rows greedy, 64 rows with beam 4), through the attention projections, the FFN and the output
projection.

    python benchmarks/matmul.py [--d_model 512 --d_ff 2048 --vocab 37000 --rows 2048]

Printed: GFLOP/s of `torch.nn.functional.linear` (MKL), of oneDNN with the weight as it is (training), and of
oneDNN with the weight reordered once (decoding inside `generate()`), and the ratios to MKL; then the weight
gradients of the training step, (out x rows) @ (rows x in) from the transposed output gradient and input as
`VaswaniLinear`'s backward has them: MKL, oneDNN (which copies the output gradient into rows) and oneDNN with the
operands swapped (which copies the input instead).
"""

import argparse
import statistics
import time
from functools import partial

import torch

from vaswani_hf.kernels import cpu_name, product


def seconds(function, repeats: int) -> float:
    """Median time of `repeats` calls after two warm-up calls."""
    function(), function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=positive, default=2)
    parser.add_argument("--repeats", type=positive, default=21)
    parser.add_argument("--d_model", type=positive, default=512)
    parser.add_argument("--d_ff", type=positive, default=2048)
    parser.add_argument("--vocab", type=positive, default=37000)
    parser.add_argument("--rows", type=positive, default=2048, help="Tokens of a training batch.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = {"attention projection": (args.d_model, args.d_model), "FFN in": (args.d_model, args.d_ff),
              "FFN out": (args.d_ff, args.d_model), "output projection": (args.d_model, args.vocab)}
    onednn = torch.ops.mkldnn._linear_pointwise
    print(f"{cpu_name()}, {args.threads} threads; median of {args.repeats}; GFLOP/s\n")
    print("| rows | product (in x out) | MKL | oneDNN | oneDNN, weight reordered once | ratios |")
    print("|---:|---|---:|---:|---:|---:|")
    for rows in (args.rows, 64, 16):
        for name, (d_in, d_out) in shapes.items():
            x, weight = torch.randn(rows, d_in), torch.randn(d_out, d_in) * d_in**-0.5
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
            torch.testing.assert_close(onednn(x, packed, None, "none", [], ""), x @ weight.T, rtol=1e-4, atol=1e-4)
            flop = 2 * rows * d_in * d_out
            rates = [
                flop / seconds(function, args.repeats) / 1e9
                for function in (
                    partial(torch.nn.functional.linear, x, weight),
                    partial(onednn, x, weight, None, "none", [], ""),
                    partial(onednn, x, packed, None, "none", [], ""),
                )
            ]
            print(f"| {rows} | {name} ({d_in} x {d_out}) | {rates[0]:.0f} | {rates[1]:.0f} | {rates[2]:.0f} | "
                  f"{rates[1] / rates[0]:.2f}x, {rates[2] / rates[0]:.2f}x |", flush=True)

    print(f"\n| weight gradient, {args.rows} rows (out x in) | MKL | oneDNN | oneDNN, operands swapped | ratios |")
    print("|---|---:|---:|---:|---:|")
    for name, (d_in, d_out) in shapes.items():
        grad_output, input = torch.randn(args.rows, d_out), torch.randn(args.rows, d_in)
        expected = grad_output.T @ input
        rates = []
        for kernel in ("torch", "onednn", "onednn_swapped"):
            torch.testing.assert_close(product(kernel, grad_output.t(), input.t()), expected, rtol=1e-4, atol=1e-3)
            elapsed = seconds(partial(product, kernel, grad_output.t(), input.t()), args.repeats)
            rates.append(2 * args.rows * d_in * d_out / elapsed / 1e9)
        print(f"| {name} ({d_out} x {d_in}) | {rates[0]:.0f} | {rates[1]:.0f} | {rates[2]:.0f} | "
              f"{rates[1] / rates[0]:.2f}x, {rates[2] / rates[0]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
