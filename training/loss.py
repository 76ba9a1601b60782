"""§5.4 Label smoothing: "we employed label smoothing of value ε_ls = 0.1".

The paper's form (tensor2tensor): the gold token gets probability 1 - ε and each of the other V - 1 tokens
ε / (V - 1). (PyTorch's `label_smoothing` spreads ε / V over all V tokens, the gold one included: close, not
the same.) The loss is the cross-entropy against that distribution, summed over the non-pad target tokens;
the caller divides by the number of target tokens of the whole optimizer step (§5.1: batches are counted in
tokens), across processes and accumulation steps.

With z the logits of one position, g its gold token and lse = log Σ_k exp z_k, the loss of the position is

    (1 - ε) (lse - z_g) + ε / (V - 1) Σ_{k≠g} (lse - z_k)  =  lse - (1 - ε) z_g - ε / (V - 1) (Σ_k z_k - z_g)

and its gradient softmax(z) - q, q the smoothed distribution. Both are computed a block of rows at a time in float32
from the logits as the model returns them (bfloat16 under autocast): at the paper's batch the logits are 25,000 x
37,000, and a float32 copy of them, with log_softmax's output and their gradients, would take some 15 GB.

On a GPU the loss is bound by memory, not arithmetic, so each block is passed over as few times as torch's kernels
allow: forward, log_softmax (whose gold entry is -NLL) and a row sum; backward, exp(z - lse), the gold entries
moved, and one multiply-add that writes the gradient in the logits' dtype.

A compiled training step (`--compile`) takes `plain_label_smoothed_nll` instead: the same sums in plain
differentiable operations, which torch.compile fuses into one pass over the logits each way (three row reductions
forward; backward, one element-wise kernel that writes the gradient in the logits' dtype), float32 only in registers.
"""

import torch

CHUNK_ELEMENTS = 1 << 27  # logits converted to float32 at a time: 512 MB, a few blocks at the paper's batch


def label_smoothed_nll(logits: torch.Tensor, labels: torch.Tensor, epsilon: float = 0.1, ignore_index: int = -100,
                       chunk_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (smoothed loss sum, NLL sum, number of target tokens) over the positions whose label is not
    `ignore_index`; only the first has a gradient, in the logits' dtype. logits: (B, T, V); labels: (B, T).
    `chunk_rows`: positions per float32 block (default: CHUNK_ELEMENTS of logits)."""
    rows = chunk_rows or max(1, CHUNK_ELEMENTS // logits.shape[-1])
    return LabelSmoothedNLL.apply(logits, labels, epsilon, ignore_index, rows)


class LabelSmoothedNLL(torch.autograd.Function):
    """The module docstring's loss and gradient, block by block: what is kept for backward is the logits themselves
    (alive anyway until the step ends) and one float per position."""

    @staticmethod
    def forward(ctx, logits, labels, epsilon, ignore_index, chunk_rows):
        vocab_size = logits.shape[-1]
        flat = logits.reshape(-1, vocab_size)  # (N, V), a view
        keep = labels.reshape(-1).ne(ignore_index)  # (N,)
        gold = labels.reshape(-1).clamp(min=0)
        nll = torch.empty(len(flat), device=flat.device)  # (N,) float32
        total = torch.empty_like(nll)  # Σ_k log p_k
        for start in range(0, len(flat), chunk_rows):
            end = start + chunk_rows
            log_probs = torch.log_softmax(flat[start:end].float(), -1)  # (n, V)
            torch.gather(log_probs, -1, gold[start:end, None], out=nll[start:end, None])
            torch.sum(log_probs, -1, out=total[start:end])
        nll.neg_()
        lse = nll + flat.gather(-1, gold[:, None]).squeeze(-1).float()
        smoothed = nll - epsilon * (nll + (total + nll) / (vocab_size - 1))
        ctx.save_for_backward(logits, lse, gold, keep)
        ctx.epsilon, ctx.chunk_rows = epsilon, chunk_rows
        # Sums over the kept positions, masked rather than indexed: indexing by a mask would wait for the GPU
        nll_sum, count = nll.where(keep, 0.0).sum(), keep.sum()
        ctx.mark_non_differentiable(nll_sum, count)
        return smoothed.where(keep, 0.0).sum(), nll_sum, count

    @staticmethod
    def backward(ctx, grad_smoothed, grad_nll, grad_count):
        logits, lse, gold, keep = ctx.saved_tensors
        vocab_size, epsilon, rows = logits.shape[-1], ctx.epsilon, ctx.chunk_rows
        flat = logits.reshape(-1, vocab_size)
        grad = torch.empty_like(flat)
        other = epsilon / (vocab_size - 1)  # q of every token but the gold one
        scale = (keep.float() * grad_smoothed)[:, None]  # (N, 1): ignored positions get no gradient
        shift = -other * scale
        in_place = grad.dtype == torch.float32  # else each block is computed in float32 and written converted
        for start in range(0, len(flat), rows):
            end = start + rows
            block = grad[start:end] if in_place else torch.empty_like(grad[start:end], dtype=torch.float32)
            torch.sub(flat[start:end], lse[start:end, None], out=block).exp_()  # softmax(z)
            correction = block.new_full((len(block), 1), other - (1 - epsilon))  # the gold token's q is 1 - ε
            block.scatter_add_(-1, gold[start:end, None], correction)
            if in_place or converts_as_it_writes(grad):  # (softmax - q) * scale
                torch.addcmul(shift[start:end], block, scale[start:end], out=grad[start:end])
            else:
                grad[start:end] = torch.addcmul(shift[start:end], block, scale[start:end], out=block)
        return grad.view_as(logits), None, None, None, None


def converts_as_it_writes(tensor: torch.Tensor) -> bool:
    """Whether a float32 product is best written into this (lower precision) tensor directly: CUDA converts in the
    same kernel, while a CPU's mixed-dtype addcmul is several times slower than a float32 one and a copy after."""
    return tensor.is_cuda


def plain_label_smoothed_nll(logits: torch.Tensor, labels: torch.Tensor, epsilon: float = 0.1,
                             ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`label_smoothed_nll`'s three sums, the module docstring's formula in plain operations for torch.compile to fuse
    (run eagerly, it would make float32 copies of the whole logits). The gold logit is picked by comparing each
    column's index with the label, not by `gather`, whose gradient would be a scatter into a zeroed float32 copy."""
    z = logits.float()
    vocab_size = z.shape[-1]
    keep = labels.ne(ignore_index)
    is_gold = torch.arange(vocab_size, device=z.device) == labels.clamp(min=0)[..., None]
    lse = z.logsumexp(-1)
    gold = z.where(is_gold, 0.0).sum(-1)
    nll = lse - gold
    smoothed = nll - epsilon * (nll + (z.sum(-1) - vocab_size * lse + nll) / (vocab_size - 1))
    return smoothed.where(keep, 0.0).sum(), nll.detach().where(keep, 0.0).sum(), keep.sum()
