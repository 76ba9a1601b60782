"""float32 matrix products on this CPU: torch's default kernel (MKL) against oneDNN, the candidates among which
`VaswaniLinear` chooses by measurement (vaswani_hf/kernels.py).

The shapes are those of transformer-base: a training step (64 x 32 tokens = 2,048 rows) and decoding steps
(16 rows greedy, 64 rows with beam 4), through the attention projections, the FFN and the output projection.

    python benchmarks/matmul.py

Printed: GFLOP/s of `torch.nn.functional.linear` (MKL), of oneDNN with the weight as it is (training), and of
oneDNN with the weight reordered once (decoding inside `generate()`), and the ratios to MKL.
"""

import argparse
import statistics
import time

import torch

from vaswani_hf.kernels import cpu_name

D_MODEL, D_FF, VOCAB = 512, 2048, 37000
SHAPES = {"attention projection": (D_MODEL, D_MODEL), "FFN in": (D_MODEL, D_FF), "FFN out": (D_FF, D_MODEL),
          "output projection": (D_MODEL, VOCAB)}


def seconds(function, repeats: int) -> float:
    """Median time of `repeats` calls after two warm-up calls."""
    function(), function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    onednn = torch.ops.mkldnn._linear_pointwise
    print(f"{cpu_name()}, {args.threads} threads; median of {args.repeats}; GFLOP/s\n")
    print("| rows | product (in x out) | MKL | oneDNN | oneDNN, weight reordered once | ratios |")
    print("|---:|---|---:|---:|---:|---:|")
    for rows in (2048, 64, 16):
        for name, (d_in, d_out) in SHAPES.items():
            x, weight = torch.randn(rows, d_in), torch.randn(d_out, d_in) * d_in**-0.5
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
            torch.testing.assert_close(onednn(x, packed, None, "none", [], ""), x @ weight.T, rtol=1e-4, atol=1e-4)
            flop = 2 * rows * d_in * d_out
            rates = [
                flop / seconds(function, args.repeats) / 1e9
                for function in (
                    lambda: torch.nn.functional.linear(x, weight),
                    lambda: onednn(x, weight, None, "none", [], ""),
                    lambda: onednn(x, packed, None, "none", [], ""),
                )
            ]
            print(f"| {rows} | {name} ({d_in} x {d_out}) | {rates[0]:.0f} | {rates[1]:.0f} | {rates[2]:.0f} | "
                  f"{rates[1] / rates[0]:.2f}x, {rates[2] / rates[0]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
