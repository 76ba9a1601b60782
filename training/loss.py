"""§5.4 Label smoothing: "we employed label smoothing of value ε_ls = 0.1".

The paper's form (tensor2tensor): the gold token gets probability 1 - ε and each of the other V - 1 tokens
ε / (V - 1). (PyTorch's `label_smoothing` spreads ε / V over all V tokens, the gold one included: close, not
the same.) The loss is the cross-entropy against that distribution, summed over the non-pad target tokens;
the caller divides by the number of target tokens of the whole optimizer step (§5.1: batches are counted in
tokens), across processes and accumulation steps.
"""

import torch


def label_smoothed_nll(logits: torch.Tensor, labels: torch.Tensor, epsilon: float = 0.1,
                       ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (smoothed loss sum, NLL sum, number of target tokens) over the positions whose label is not
    `ignore_index`. logits: (B, T, V); labels: (B, T)."""
    vocab_size = logits.shape[-1]
    log_probs = logits.float().log_softmax(-1)  # (B, T, V)
    keep = labels.ne(ignore_index)
    gold = labels.clamp(min=0).unsqueeze(-1)
    nll = -log_probs.gather(-1, gold).squeeze(-1)  # (B, T)
    others = -log_probs.sum(-1) - nll  # -Σ_{k≠gold} log p_k
    smoothed = (1 - epsilon) * nll + epsilon / (vocab_size - 1) * others
    # Sums over the kept positions, masked rather than indexed: indexing by a mask would wait for the GPU
    return smoothed.where(keep, 0.0).sum(), nll.where(keep, 0.0).sum(), keep.sum()
