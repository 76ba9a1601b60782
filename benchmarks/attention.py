"""torch's SDPA kernel against the eager product (`eager_attention_forward`) at the shapes of a decoding step on the
CPU: the two candidates among which the "vaswani_measured" attention kernel chooses by measurement (kernels.py).

    python benchmarks/attention.py

Shapes: 16 sources × 4 beams; self-attention of one new token over t cached ones, and encoder-decoder attention of
a block of 4 beams' tokens over a 32-token source; the heads of the benchmark's small and base sizes (d_k 64).
Printed: median microseconds per call and the ratio SDPA / eager.
"""

import argparse
from functools import partial
from types import SimpleNamespace

import torch
from matmul import seconds  # this folder's median timer
from torch.nn.functional import scaled_dot_product_attention

from vaswani_hf.kernels import cpu_name
from vaswani_hf.modeling_vaswani import eager_attention_forward


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    module = SimpleNamespace(training=False)
    print(f"{cpu_name()}, {args.threads} threads; median µs per call\n")
    print("| heads | call | query rows × keys | SDPA µs | eager µs | SDPA / eager |")
    print("|---:|---|---|---:|---:|---:|")
    for heads in (4, 8):
        for call, batch, rows, keys in (("self-attention, step 8", 64, 1, 8), ("self-attention, step 32", 64, 1, 32),
                                        ("encoder-decoder, 4 beams", 16, 4, 32)):
            query = torch.randn(batch, heads, rows, 64)
            key, value = torch.randn(batch, heads, keys, 64), torch.randn(batch, heads, keys, 64)
            mask = torch.ones(batch, 1, 1, keys, dtype=torch.bool)  # a padding mask, as transformers builds it
            sdpa = partial(scaled_dot_product_attention, query, key, value, attn_mask=mask)
            eager = partial(eager_attention_forward, module, query, key, value, mask, 64**-0.5)
            sdpa, eager = (seconds(call, args.repeats) * 1e6 for call in (sdpa, eager))
            print(f"| {heads} | {call} | {batch}·{rows} × {keys} | {sdpa:.0f} | {eager:.0f} | {sdpa / eager:.2f}x |")


if __name__ == "__main__":
    main()
