"""vaswani_hf.fast_gpu: each attention's projections of one input as one product — the function of the plain model,
its parameters and files unchanged, and the number of products the fusion promises."""

import collections
import copy

import pytest
import torch
from support import PAD, random_ids, tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from vaswani_hf import fast_gpu
from vaswani_hf.speed.attention import FastAttention

PRODUCTS = ("aten.addmm.default", "aten.mm.default")  # what nn.functional.linear runs as on a CPU


class Products(TorchDispatchMode):
    """Counts the matrix products dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in PRODUCTS:
            self.count[str(func)] += 1
        return func(*args, **(kwargs or {}))


def padded_batch():
    source, labels = random_ids(3, 7, seed=1), random_ids(3, 5, seed=2)
    source[0, 4:] = PAD
    labels[1, 3:] = -100
    return {"input_ids": source, "attention_mask": source.ne(PAD).long(), "labels": labels}


def test_training_under_autocast_runs_fused_and_gives_the_plain_models_loss_and_gradients():
    """bf16 autocast, as training/run.py trains on a GPU: the products fused, the loss and gradients the plain
    model's to bf16's rounding."""
    plain = tiny_model().train()
    fused = fast_gpu(copy.deepcopy(plain))
    losses, counts = [], []
    for model in (plain, fused):
        with torch.autocast("cpu", dtype=torch.bfloat16), Products() as products:
            loss = model(**padded_batch()).loss
        loss.backward()
        losses.append(loss)
        counts.append(sum(products.count.values()))
    assert counts[1] < counts[0]
    torch.testing.assert_close(losses[1], losses[0], atol=1e-2, rtol=1e-2)
    grads = {name: parameter.grad for name, parameter in plain.named_parameters()}
    for name, parameter in fused.named_parameters():
        torch.testing.assert_close(parameter.grad, grads[name], atol=1e-2, rtol=1e-2, msg=name)


def kept_for_backward(model, autocast: bool) -> int:
    """Bytes of the tensors autograd keeps for backward from a training forward, the parameters' own not counted."""
    parameters = {parameter.untyped_storage().data_ptr() for parameter in model.parameters()}
    kept = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), torch.autocast(
            "cpu", dtype=torch.bfloat16, enabled=autocast):
        model.train()(**padded_batch())
    return sum(kept.values())


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16 autocast"])
def test_training_keeps_no_more_for_backward_than_the_plain_model(autocast):
    """Fused in float32 training, backward would keep the concatenated weights, a copy of the parameters."""
    plain = tiny_model()
    assert kept_for_backward(fast_gpu(copy.deepcopy(plain)), autocast) <= kept_for_backward(plain, autocast)


@pytest.mark.parametrize("num_beams", [1, 4])
@torch.no_grad()
def test_decoding_with_the_cache_gives_the_plain_models_sequences(num_beams):
    plain = tiny_model()
    fused = fast_gpu(copy.deepcopy(plain))
    batch = padded_batch()
    outputs = [model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                              num_beams=num_beams, max_new_tokens=8, output_scores=True,
                              return_dict_in_generate=True) for model in (plain, fused)]
    assert torch.equal(outputs[1].sequences, outputs[0].sequences)
    torch.testing.assert_close(outputs[1].scores, outputs[0].scores)


def test_the_parameters_and_saved_files_are_the_plain_models_and_twice_is_once(tmp_path):
    plain = tiny_model()
    fused = fast_gpu(fast_gpu(copy.deepcopy(plain)))
    assert [isinstance(m, FastAttention) and m.fuse for m in fused.modules()].count(True) == 2 + 2 * 3  # 2, 3 layers
    assert plain.state_dict().keys() == fused.state_dict().keys()
    assert all(torch.equal(value, fused.state_dict()[key]) for key, value in plain.state_dict().items())
    plain.save_pretrained(tmp_path / "plain")
    fused.save_pretrained(tmp_path / "fused")
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "fused" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


@torch.no_grad()
def test_self_attention_runs_one_product_for_q_k_v_and_encoder_decoder_attention_one_for_k_v():
    """Products in a forward, by the architecture: each encoder layer runs its self-attention's Q, K, V and output
    projections and the FFN's two; each decoder layer adds encoder-decoder attention's four; then the logits. Fused:
    Q, K, V as one product, and K, V as one."""
    batch = padded_batch()
    model = tiny_model()
    config = model.config
    plain_count = config.num_layers * (4 + 2) + config.num_decoder_layers * (4 + 4 + 2) + 1
    fused_count = config.num_layers * (2 + 2) + config.num_decoder_layers * (2 + 3 + 2) + 1
    for transform, expected in ((lambda m: m, plain_count), (fast_gpu, fused_count)):
        with Products() as products:
            transform(model)(**batch)
        assert sum(products.count.values()) == expected
