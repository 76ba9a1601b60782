"""`fast_cpu(model)` (vaswani_hf/speed/: fast_cpu.py, decoding.py, kernels.py): its plan is what whole calls were
measured faster with, measured once and kept; a mechanism is taken only when it pays; whatever the plan, decoding gives
what the plain path gives and training the plain model's weights (bit for bit where the plan trains as torch does);
packed weights are used only while valid; the plain
model never touches them; the attention kernel the user names is the one that runs; freed memory kept for reuse."""

import collections
import copy
import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import random_ids, tiny_model
from transformers import AutoConfig
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from vaswani_hf import fast_cpu, fast_gpu, keep_freed_memory, modeling_vaswani, quantize_int8
from vaswani_hf.speed import allocator, kernels
from vaswani_hf.speed.decoding import PLAIN
from vaswani_hf.speed.kernels import PACKING, PackedLinear, fingerprint

fast_cpu_module = sys.modules["vaswani_hf.speed.fast_cpu"]  # the package's name `fast_cpu` is the function
EVERYTHING = {"greedy": {"lean": True, "packed": True}, "beam": {"shared": True, "lean": True, "packed": True},
              "training": {"onednn": True}}


@pytest.fixture(autouse=True)
def nothing_packed(monkeypatch):
    """PACKING with nothing packed (other tests' models may be alive), restored after."""
    import weakref

    monkeypatch.setattr(PACKING, "packed", weakref.WeakKeyDictionary())


@pytest.fixture
def plans(tmp_path, monkeypatch):
    """A cache of plans of its own; the plans measured while it is in use, on a probe a quarter the size (the tests
    that use it check when plans are measured, kept and read back, not which mechanism wins)."""
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(fast_cpu_module, "PROBE", {key: max(1, value // 4) for key, value in
                                                   fast_cpu_module.PROBE.items()})
    measured = []
    real = fast_cpu_module.measured_plan

    def counted(model, modes):
        measured.append((model, modes))
        return real(model, modes)

    monkeypatch.setattr(fast_cpu_module, "measured_plan", counted)
    return measured


def test_timing_a_model_whose_generation_config_sets_lengths_warns_of_nothing(plans, capfd):
    """A converted Marian model's generation config sets `max_length` (512 as published): each generate() call of the
    probe made transformers warn that `max_new_tokens` was set beside it (42 lines on a first vaswani-translate); a
    converted fairseq or FSMT model's `length_penalty`, that greedy decoding ignores it. The model's generation
    config is given back as it was."""
    model = tiny_model(seed=8)
    model.generation_config.update(max_length=40, min_length=2, num_beams=4, length_penalty=0.6)
    decoding = model.generation_config
    capfd.readouterr()  # (what the update said)
    fast_cpu(model, training=False)
    err = capfd.readouterr().err
    assert plans and "seem to have been set" not in err and "may be ignored" not in err, err
    assert model.generation_config is decoding
    assert (decoding.max_length, decoding.min_length, decoding.num_beams, decoding.length_penalty) == (40, 2, 4, 0.6)


def kept_by_mode(tmp_path, int8: bool = False) -> dict:
    """The choices kept in the `plans` fixture's cache, by mode, of the float32 model's sizes or the int8 copy's."""
    kept = [json.loads(path.read_text(encoding="utf-8")) for path in (tmp_path / "cache" / "fast_cpu").glob("*.json")]
    return {entry["mode"]: entry for entry in kept if entry["int8"] == int8}


# --- packed layers -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("frozen_input", [False, True])
def test_training_products_are_torchs_even_in_a_packing_block(frozen_input):
    """With gradient, unless the plan trains in oneDNN, a transformed layer is `nn.Linear`: torch's own backward (its
    autograd node), the same outputs and gradients bit for bit, nothing packed; its weight's gradient too where its
    input needs none (the first layer after frozen embeddings)."""
    torch.manual_seed(0)
    plain = torch.nn.Linear(24, 40)
    layer = PackedLinear(24, 40)
    layer.load_state_dict(plain.state_dict())
    x = torch.randn(7, 5, 24).transpose(0, 1).requires_grad_(not frozen_input)  # (5, 7, 24), not contiguous
    outputs = []
    for module in (plain, layer):
        with PACKING.block():
            y = module(x)
        y.backward(torch.ones_like(y))
        outputs.append((y, torch.zeros(1) if frozen_input else x.grad.clone(), module.weight.grad, module.bias.grad))
        x.grad = None
    assert len(PACKING.packed) == 0
    assert type(outputs[1][0].grad_fn) is type(outputs[0][0].grad_fn)  # at these sizes oneDNN's results are equal
    for ours, torchs in zip(*outputs):
        assert torch.equal(ours, torchs)


@pytest.mark.parametrize(("features", "bias"), [((24, 40), True), ((24, 40), False), ((40, 24), True)])
def test_a_layer_training_in_onednn_computes_the_formula_and_its_gradients(features, bias):
    """The plan's training in oneDNN: y = x W^T + b and the three gradients against the formula in float64, for a
    3-D input that is not contiguous, in a layer that widens and one that narrows; nothing packed."""
    torch.manual_seed(0)
    (fan_in, fan_out) = features
    layer = PackedLinear(fan_in, fan_out, bias=bias)
    layer.onednn_training = True
    x = torch.randn(7, 5, fan_in).transpose(0, 1).requires_grad_()  # (5, 7, in)
    upstream = torch.randn(5, 7, fan_out)
    with PACKING.block():
        y = layer(x)
    y.backward(upstream)
    assert y.grad_fn.name().startswith("OneDNNLinear") and len(PACKING.packed) == 0
    w, x64, g = layer.weight.detach().double(), x.detach().double(), upstream.double()
    expected = x64 @ w.T + (layer.bias.detach().double() if bias else 0)
    close = functools.partial(torch.testing.assert_close, rtol=1e-5, atol=1e-5)
    close(y.double(), expected)
    close(x.grad.double(), g @ w)
    close(layer.weight.grad.double(), g.reshape(-1, fan_out).T @ x64.reshape(-1, fan_in))
    if bias:
        close(layer.bias.grad.double(), g.sum((0, 1)))


def test_training_in_onednn_gives_the_plain_models_weights_and_the_same_weights_twice():
    """A few Adam steps of a transformed model whose plan trains in oneDNN: the plain model's weights to float32's
    rounding, and bit for bit the same when run again."""
    source = random_ids(4, 9, seed=2)

    def trained(model):
        torch.manual_seed(1)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(3):
            model.train()(input_ids=source, labels=source).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        return model.state_dict()

    plain = trained(tiny_model(seed=4))
    once, twice = (trained(fast_cpu(tiny_model(seed=4), {**PLAIN, "training": {"onednn": True}})) for _ in range(2))
    for name, tensor in plain.items():
        torch.testing.assert_close(once[name], tensor, rtol=1e-4, atol=1e-5)
        assert torch.equal(once[name], twice[name]), name


def test_a_packed_layer_computes_the_formula_inside_a_block_and_is_nn_linear_outside():
    torch.manual_seed(0)
    layer = PackedLinear(24, 40).eval()
    x = torch.randn(4, 1, 24)
    expected = x.double() @ layer.weight.detach().double().T + layer.bias.detach().double()
    with torch.no_grad():
        outside = layer(x)
        assert layer not in PACKING.packed
        with PACKING.block():
            inside = layer(x)
    assert layer in PACKING.packed  # the packed weight was what multiplied
    assert torch.equal(outside, torch.nn.functional.linear(x, layer.weight, layer.bias))
    torch.testing.assert_close(inside.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bfloat16", ["autocast", "weights"])
def test_in_bfloat16_a_packed_layer_is_nn_linear_even_in_a_block(bfloat16):
    """bfloat16 autocast (a CPU run's --bf16), or a model cast to bfloat16, computes the product in bfloat16 as
    torch's layer does; a block's oneDNN product would be another result."""
    torch.manual_seed(0)
    layer = PackedLinear(24, 40).eval().to(torch.bfloat16 if bfloat16 == "weights" else torch.float32)
    x = torch.randn(4, 1, 24, dtype=layer.weight.dtype)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16 == "autocast"):
        expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
        with PACKING.block():
            inside = layer(x)
    assert inside.dtype == torch.bfloat16 and torch.equal(inside, expected) and layer not in PACKING.packed


def test_the_plain_model_runs_torchs_layers_and_packs_nothing():
    """What travels to the Hub: nn.Linear and transformers' SDPA; nothing measured, nothing packed."""
    model, source = tiny_model(seed=8), random_ids(3, 8, seed=6)
    assert {type(module) for module in model.modules() if isinstance(module, torch.nn.Linear)} == {torch.nn.Linear}
    model.generate(source, num_beams=4, max_new_tokens=4)
    model.train()(input_ids=source, labels=source).loss.backward()
    assert len(PACKING.packed) == 0 and "generate" not in vars(model)


def test_fast_cpu_changes_the_layers_not_the_weights_and_twice_is_once():
    model = tiny_model(seed=8)
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    linear = sum(isinstance(module, torch.nn.Linear) for module in model.modules())
    assert fast_cpu(fast_cpu(model, EVERYTHING), EVERYTHING) is model
    assert sum(type(module) is PackedLinear for module in model.modules()) == linear
    assert all(torch.equal(tensor, weights[name]) for name, tensor in model.state_dict().items())
    assert model.generate.__self__ is model and model._inner_generate.__func__ is type(model).generate


@pytest.mark.parametrize("plan", [{"greedy": {"packed": True}}, {**EVERYTHING, "beam": {"packed": True}},
                                  {**EVERYTHING, "greedy": {"packed": True, "fused": True}}])
def test_a_plan_of_another_layout_is_a_one_line_error(plan):
    with pytest.raises(ValueError, match=r"^fast_cpu: plan must name what decoding.PLAIN names, .*; got "):
        fast_cpu(tiny_model(), plan)


@pytest.mark.parametrize("transform", [fast_cpu, fast_gpu], ids=["fast_cpu", "fast_gpu"])
def test_another_kind_of_model_is_a_one_line_error_before_anything_is_done(monkeypatch, transform):
    """fast_cpu timed a MarianMTModel, then failed on an attribute of ours; fast_gpu said nothing and did nothing."""
    from transformers import MarianConfig, MarianMTModel

    monkeypatch.setattr(fast_cpu_module, "kept_plan", lambda *args: pytest.fail("timed"))
    marian = MarianMTModel(MarianConfig(vocab_size=16, d_model=8, encoder_layers=1, decoder_layers=1,
                                        encoder_ffn_dim=8, decoder_ffn_dim=8, encoder_attention_heads=2,
                                        decoder_attention_heads=2, pad_token_id=0, decoder_start_token_id=0))
    with pytest.raises(TypeError, match=rf"^{transform.__name__}: takes a vaswani_hf model "
                                        r"\(VaswaniForConditionalGeneration\), got MarianMTModel$"):
        transform(marian)


def test_a_deep_copy_of_a_transformed_model_decodes_with_its_own_weights():
    """quantize_int8 deep-copies: the copy's generate() must run the copy, not the original."""
    model, source = fast_cpu(tiny_model(seed=8), EVERYTHING), random_ids(3, 8, seed=6)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.lm_head.weight.mul_(-1)  # the copy now prefers other tokens
    assert not torch.equal(twin.generate(source, max_new_tokens=4), model.generate(source, max_new_tokens=4))
    assert twin.generate.__self__ is twin and twin._inner_generate.__self__ is twin


def test_the_translator_transforms_a_float32_model_on_a_cpu_unless_told_not_to(translation_folder, plans):
    from vaswani_hf.tools.translate import load

    fast, _ = load(str(translation_folder), "cpu")
    plain, _ = load(str(translation_folder), "cpu", fast=False)  # vaswani-translate --no_fast_cpu
    int8, _ = load(str(translation_folder), "cpu", int8=True)
    plain_int8, _ = load(str(translation_folder), "cpu", int8=True, fast=False)
    linear = torch.nn.Linear
    packs = fast.fast_cpu_plan["greedy"]["packed"] or fast.fast_cpu_plan["beam"]["packed"]
    layers = {type(module) for module in fast.modules() if isinstance(module, linear)}
    assert layers == {PackedLinear if packs else linear}
    assert {type(module) for module in plain.modules() if isinstance(module, linear)} == {linear}
    assert [model for model, _ in plans] == [fast, int8]  # the int8 copy measured its own
    assert "fast_cpu_plan" not in vars(plain) and "fast_cpu_plan" not in vars(plain_int8)


# --- the plan ----------------------------------------------------------------------------------------------------

def steady(*seconds: float) -> list[list[float]]:
    """Each candidate's seconds the same in every round."""
    return [[second] * fast_cpu_module.ROUNDS for second in seconds]


@pytest.mark.parametrize(("rounds", "expected"), [
    (steady(1.0, 0.98), 0),  # 2% is within the measurement's noise: plain stays
    (steady(1.0, 0.96), 1),
    (steady(1.0, 0.97), 1),  # exactly 3%
    (steady(1.0, 1.0, 0.95), 2),  # packing on top of shared rows pays against the plain way, which stayed chosen
    (steady(1.0, 0.9, 0.89), 1),  # packing adds 1% to shared rows: not taken
    ([[1.0] * 5, [0.8] + [0.9] * 4, [0.85] * 5], 1),  # typically faster than the one chosen, slower than its best
    (steady(1.0, 1.2, 1.1), 0),  # slower: never taken
    ([[1.0] * 5, [0.5] + [1.0] * 4], 0),  # one lucky round: best by half, the same by the median
    ([[0.8] + [1.0] * 4, [0.9] * 5], 0),  # faster by the median, slower than the plain way's best
    ([[1.0, 1.3, 1.0, 1.2, 1.0], [0.9, 1.2, 0.9, 1.1, 0.9]], 1),  # both agree, through the rounds' noise
])
def test_a_mechanism_is_taken_only_when_it_saves_at_least_three_percent_at_best_and_typically(rounds, expected):
    assert fast_cpu_module.chosen(rounds) == expected


def test_the_rounds_alternate_their_turn_after_a_warm_up():
    """Each round runs every candidate once, in reverse turn every other round: what a call leaves behind (caches,
    packed weights) does not always fall on the same neighbour."""
    calls = []
    timers = [lambda name=name: calls.append(name) or float(len(calls)) for name in "abc"]
    rounds = fast_cpu_module.round_seconds(timers)
    assert calls[:3] == list("abc") and len(calls) == 3 * (1 + fast_cpu_module.ROUNDS)
    assert calls[3:9] == list("abccba")
    assert [len(times) for times in rounds] == [fast_cpu_module.ROUNDS] * 3
    assert rounds[0][:2] == [4.0, 9.0] and rounds[2][:2] == [6.0, 7.0]  # each timer's own seconds


@pytest.mark.parametrize("training", [False, True])
def test_the_plan_is_what_the_measured_calls_were_fastest_with(monkeypatch, training):
    """measured_plan times each candidate of CANDIDATES on whole generate() calls (faked here: in greedy decoding the
    lean step pays and packing on top of it does not; in beam search shared rows pay, the lean step on top of them too
    little, and packing on top of both does; every other round 1% slower), on sources of words (no special token),
    decoding in eval mode and training in train mode whatever the model's mode, and takes what `chosen` says, keeping
    each candidate's best seconds."""
    calls = collections.Counter()

    def seconds(*key) -> float:  # every candidate 1% slower in its warm-up and every other round after it
        calls[key] += 1
        return cost[key] * (1.01 if calls[key] % 2 else 1.0)

    cost = {("greedy", False, False, False): 1.0, ("greedy", False, True, False): 0.9,
            ("greedy", False, True, True): 1.5, ("beam", False, False, False): 4.0, ("beam", True, False, False): 3.0,
            ("beam", True, True, False): 2.95, ("beam", True, True, True): 2.0, ("training", False): 3.0,
            ("training", True): 2.0}
    timed = []

    def generate_seconds(model, plan, **inputs):
        mode = "beam" if inputs["generation_config"].num_beams > 1 else "greedy"
        assert plan == {**PLAIN, mode: plan[mode]} and model.fast_cpu_plan == PLAIN  # one mode's candidate
        assert not model.training and inputs["input_ids"].min() > 3  # 0-3: pad, start, end, unknown
        timed.append(mode)
        return seconds(mode, plan[mode].get("shared", False), plan[mode]["lean"], plan[mode]["packed"])

    def training_seconds(model, source, target, plan):
        assert plan == {**PLAIN, "training": plan["training"]} and model.training
        assert source.min() > 3 and target.min() > 3
        timed.append("training")
        return seconds("training", plan["training"]["onednn"])

    monkeypatch.setattr(fast_cpu_module, "generate_seconds", generate_seconds)
    monkeypatch.setattr(fast_cpu_module, "training_seconds", training_seconds)
    model = fast_cpu(tiny_model(seed=3), PLAIN).train(training)
    plan, kept = fast_cpu_module.measured_plan(model)
    assert plan == {"greedy": {"lean": True, "packed": False}, "beam": {"shared": True, "lean": True, "packed": True},
                    "training": {"onednn": True}}
    assert [entry["seconds"] for entry in kept["beam"]] == [4.0, 3.0, 2.95, 2.0]
    rounds = 1 + fast_cpu_module.ROUNDS  # a warm-up, then the rounds
    assert timed.count("greedy") == 3 * rounds and timed.count("beam") == 4 * rounds
    assert timed.count("training") == 2 * rounds
    assert model.fast_cpu_plan == PLAIN and model.training == training  # left as found


def test_a_torch_without_onednn_times_no_candidate_that_packs_or_trains_in_it(monkeypatch):
    monkeypatch.setattr(fast_cpu_module, "ONEDNN", False)
    assert fast_cpu_module.candidates(tiny_model()) == {
        "greedy": [{"lean": False, "packed": False}, {"lean": True, "packed": False}],
        "beam": [{"shared": False, "lean": False, "packed": False}, {"shared": True, "lean": False, "packed": False},
                 {"shared": True, "lean": True, "packed": False}],
        "training": [{"onednn": False}]}


def test_a_probe_cut_short_leaves_the_model_plain_and_in_its_mode(monkeypatch):
    """Interrupted (Ctrl-C, an error) while a packing candidate is timed, the model computes as the plain one."""
    real = fast_cpu_module.generate_seconds

    def generate_seconds(model, plan, **inputs):
        seconds = real(model, plan, **inputs)
        if plan["greedy"]["packed"]:
            raise KeyboardInterrupt
        return seconds

    monkeypatch.setattr(fast_cpu_module, "generate_seconds", generate_seconds)
    model = fast_cpu(tiny_model(seed=3), PLAIN).train()
    with pytest.raises(KeyboardInterrupt):
        fast_cpu_module.measured_plan(model, ("greedy",))
    assert model.fast_cpu_plan == PLAIN and model.training
    assert {type(module) for module in model.modules() if isinstance(module, torch.nn.Linear)} == {torch.nn.Linear}


@pytest.mark.parametrize("gnmt_alpha", [None, 0.6])
def test_the_decoding_probes_make_every_token_even_of_a_model_that_ends_every_sentence_at_once(monkeypatch,
                                                                                               gnmt_alpha):
    """The probe times `new_tokens` steps of every sequence, whatever the model's sentences would be, in the search
    its generation config names (a trained model's: the paper's, with `gnmt_alpha`)."""
    monkeypatch.setattr(fast_cpu_module, "PROBE", {**fast_cpu_module.PROBE, "sources": 2, "new_tokens": 5})
    model = fast_cpu(tiny_model(seed=3, add_final_logits_bias=True), PLAIN)
    model.generation_config.gnmt_alpha = gnmt_alpha
    model.final_logits_bias[0, model.config.eos_token_id] = 1e4  # the end of the sentence, whatever came before
    assert model.generate(random_ids(2, 6, seed=1), max_new_tokens=5).shape[1] < 1 + 5  # the start, < 5 tokens
    real, lengths = model.generate, []
    model.generate = lambda **inputs: lengths.append(real(**inputs).shape[1])
    fast_cpu_module.measured_plan(model, ("greedy", "beam"))
    assert len(lengths) == 7 * (1 + fast_cpu_module.ROUNDS) and set(lengths) == {1 + 5}


def test_a_model_with_frozen_parameters_is_timed_training_the_others(plans):
    """Fine-tuning with the embeddings frozen: the training probe takes the gradients of the parameters that train."""
    model = tiny_model(seed=1)
    model.get_input_embeddings().weight.requires_grad_(False)
    fast_cpu(model)
    assert plans and "training" in plans[0][1]


def test_the_probe_packs_each_weight_once_as_a_translation_does(monkeypatch):
    """Candidates that pack and candidates that do not take turns in the rounds; the copies packed in the warm-up
    serve every later round, as they serve every call of a translation: packing is not timed again and again."""
    model = fast_cpu(tiny_model(seed=3), PLAIN).eval()
    real, copies = fast_cpu_module.generate_seconds, []

    def generate_seconds(model, plan, **inputs):
        seconds = real(model, plan, **inputs)
        if plan["greedy"]["packed"]:
            copies.append(PACKING.packed[model.lm_head][3])
        return seconds

    monkeypatch.setattr(fast_cpu_module, "generate_seconds", generate_seconds)
    fast_cpu_module.measured_plan(model, ("greedy",))
    assert len(copies) == 1 + fast_cpu_module.ROUNDS and all(copy is copies[0] for copy in copies)


def test_measuring_the_plan_leaves_the_weights_gradients_and_random_state_as_found(monkeypatch):
    """fast_cpu in a training run (training/run.py) before its first step: the run's draws are its own. With a trained
    model's generation config (training/hub.py: early stopping), the greedy probe draws no transformers warning."""
    from transformers.generation import configuration_utils

    warned = []
    monkeypatch.setattr(configuration_utils.logger, "warning_once", lambda message, *args: warned.append(message))
    model = fast_cpu(tiny_model(seed=3, dropout=0.1), PLAIN)  # the training probe draws dropout masks
    model.generation_config.early_stopping = True
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    fast_cpu_module.measured_plan(model)
    assert torch.equal(torch.rand(3), expected)
    assert all(torch.equal(tensor, weights[name]) for name, tensor in model.state_dict().items())
    assert all(parameter.grad is None for parameter in model.parameters())
    assert warned == []


def test_a_model_with_fewer_learned_positions_than_the_probe_is_timed_on_a_probe_cut_to_them(plans, tmp_path):
    """Greedy, beam and training probes of a model with 3 learned positions: sources, new tokens and training pairs
    of 3 tokens (its positions stop there), kept as the facts the plan was measured under. Sinusoids have no last
    position: with them, the whole probe."""
    quarter = fast_cpu_module.PROBE  # (the `plans` fixture's)
    assert min(quarter["source_length"], quarter["new_tokens"], quarter["pair_length"]) > 3
    fast_cpu(tiny_model(seed=1, max_position_embeddings=3))
    modes = ("greedy", "beam", "training")
    assert {mode: entry["probe"] for mode, entry in kept_by_mode(tmp_path).items()} == dict.fromkeys(modes, quarter)
    shutil.rmtree(tmp_path / "cache")
    fast_cpu(tiny_model(seed=1, position_embedding="learned", max_position_embeddings=3))
    cut = {**quarter, "source_length": 3, "new_tokens": 3, "pair_length": 3}
    assert {mode: entry["probe"] for mode, entry in kept_by_mode(tmp_path).items()} == dict.fromkeys(modes, cut)


def test_the_plan_is_measured_once_and_read_back_for_the_same_machine_and_sizes(plans, monkeypatch, tmp_path):
    from transformers.testing_utils import CaptureLogger

    with CaptureLogger(fast_cpu_module.logger) as said:
        first = fast_cpu(tiny_model(seed=1))
    assert len(plans) == 1
    assert said.out.startswith("fast_cpu: timing greedy, beam, training on this CPU for this model's sizes, once")
    kept = kept_by_mode(tmp_path)
    assert {mode: entry["choice"] for mode, entry in kept.items()} == first.fast_cpu_plan
    for mode, entry in kept.items():
        assert entry["threads"] == torch.get_num_threads() and entry["sizes"]["d_model"] == first.config.d_model
        assert entry["cpu"] and entry["torch"] == torch.__version__ and not entry["int8"]
        assert [{name: on for name, on in timed.items() if name != "seconds"} for timed in entry["seconds"]] == \
            entry["candidates"] == fast_cpu_module.CANDIDATES[mode]
    with CaptureLogger(fast_cpu_module.logger) as said:
        again = fast_cpu(tiny_model(seed=2))  # other weights, the same sizes: read back, silently
    assert len(plans) == 1 and again.fast_cpu_plan == first.fast_cpu_plan and said.out == ""
    fast_cpu(tiny_model(seed=1, d_model=48))  # other sizes
    fast_cpu(tiny_model(seed=1, num_decoder_layers=2))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)  # another thread count
    fast_cpu(tiny_model(seed=1))
    assert len(plans) == 4
    monkeypatch.setattr(fast_cpu_module, "ROUNDS", 3)  # a plan chosen by another rule (best of three, before)
    fast_cpu(tiny_model(seed=1))
    assert len(plans) == 5


def test_vaswani_translate_plans_decoding_alone_and_reads_a_training_runs_choices(plans, tmp_path,
                                                                                    translation_folder):
    """The tools that only decode (`vaswani_hf.tools.loading.load`, as vaswani-translate loads) time no training,
    and training stays torch's. After a training run of the same sizes (the main job, then vaswani-translate) they
    take the decoding choices the run kept and time nothing; a model transformed for training after them times
    training alone."""
    from vaswani_hf.tools.loading import load

    sizes = {name: getattr(AutoConfig.from_pretrained(translation_folder), name) for name in fast_cpu_module.SIZES}
    trained = fast_cpu(tiny_model(seed=1, **sizes))
    model, _ = load(str(translation_folder), device="cpu")
    assert [modes for _, modes in plans] == [("greedy", "beam", "training")]
    assert model.fast_cpu_plan == {**trained.fast_cpu_plan, "training": PLAIN["training"]}
    (tmp_path / "cache").rename(tmp_path / "before")
    load(str(translation_folder), device="cpu")
    assert set(kept_by_mode(tmp_path)) == {"greedy", "beam"}
    fast_cpu(tiny_model(seed=2, **sizes))
    assert [modes for _, modes in plans] == [("greedy", "beam", "training"), ("greedy", "beam"), ("training",)]


def test_an_int8_copy_plans_decoding_with_its_own_candidates_timed_with_its_own_calls(plans, tmp_path):
    """The int8 copy does not train, has no float32 weights to pack, and shared beams would change its tokens: its
    plan times its own greedy and beam calls with the lean step or without, kept apart from the float32 model's of the
    same sizes and read back. A copy of a transformed model does not inherit its plan."""
    fast_cpu(tiny_model(seed=1))
    int8 = fast_cpu(quantize_int8(tiny_model(seed=1)))
    assert [modes for _, modes in plans] == [("greedy", "beam", "training"), ("greedy", "beam")]
    own = kept_by_mode(tmp_path, int8=True)
    assert {**PLAIN, **{mode: entry["choice"] for mode, entry in own.items()}} == int8.fast_cpu_plan
    for mode, listed in fast_cpu_module.INT8_CANDIDATES.items():  # timed: each candidate, and no other
        timed = [{name: on for name, on in entry.items() if name != "seconds"} for entry in own[mode]["seconds"]]
        assert timed == own[mode]["candidates"] == listed
    again = fast_cpu(quantize_int8(tiny_model(seed=2)))
    assert len(plans) == 2 and again.fast_cpu_plan == int8.fast_cpu_plan
    assert quantize_int8(fast_cpu(tiny_model(seed=1), EVERYTHING)).fast_cpu_plan == PLAIN


@pytest.mark.parametrize("mode", ["greedy", "beam"])
def test_every_plan_an_int8_copy_may_take_decodes_as_the_plain_copy_bit_for_bit(monkeypatch, mode):
    """Each of the int8 copy's candidates gives the plain int8 copy's tokens and every step's scores, bit for bit: its
    activations are quantized per tensor, and the lean step calls each int8 layer on the rows the decoder's own step
    does. (Beams sharing their source would not: their scores differ in the last bits here.)"""
    source, mask = padded_source()
    options = {"attention_mask": mask, "num_beams": 4 if mode == "beam" else 1, "min_new_tokens": 10}  # at most 10
    plain = decode(quantize_int8(tiny_model(seed=5)), source, **options)
    for candidate in fast_cpu_module.INT8_CANDIDATES[mode]:
        model = fast_cpu(quantize_int8(tiny_model(seed=5)), {**PLAIN, mode: candidate})
        calls = own_forward_calls(monkeypatch, model)
        found = decode(model, source, **options)
        assert len(calls) == (1 if candidate["lean"] else 10)  # the lean step takes every step after the first
        assert torch.equal(found.sequences, plain.sequences), candidate
        assert all(torch.equal(ours, own) for ours, own in zip(found.scores, plain.scores, strict=True)), candidate


@pytest.mark.parametrize("damage", [lambda text: text[:20], lambda text: json.dumps(
    {key: value for key, value in json.loads(text).items() if key != "choice"})], ids=["cut short", "no choice"])
def test_a_damaged_choice_is_measured_again_alone(plans, tmp_path, damage):
    fast_cpu(tiny_model(seed=1))
    (kept,) = [path for path in (tmp_path / "cache" / "fast_cpu").glob("*.json")
               if json.loads(path.read_text(encoding="utf-8"))["mode"] == "beam"]
    kept.write_text(damage(kept.read_text(encoding="utf-8")), encoding="utf-8")
    model = fast_cpu(tiny_model(seed=1))
    assert [modes for _, modes in plans] == [("greedy", "beam", "training"), ("beam",)]
    assert json.loads(kept.read_text(encoding="utf-8"))["choice"] == model.fast_cpu_plan["beam"]


def test_choices_kept_are_read_back_from_a_cache_that_cannot_be_written(plans, monkeypatch):
    """A cache filled once and shared read-only (a cluster's): what it holds needs no writing, no lock."""
    first = fast_cpu(tiny_model(seed=1))

    def refused(folder):
        raise kernels.CacheNotWritable(f"cannot write {folder}")

    monkeypatch.setattr(kernels, "writable", refused)
    assert fast_cpu(tiny_model(seed=2)).fast_cpu_plan == first.fast_cpu_plan and len(plans) == 1


@pytest.mark.parametrize(("cpuinfo", "expected"), [
    ("processor\t: 0\ncpu family\t: 25\nmodel\t: 1\nmodel name\t: AMD EPYC 7B13\n\nprocessor\t: 1\nmodel name\t: B\n",
     "AMD EPYC 7B13 (family 25, model 1)"),
    ("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n", "{processor}")], ids=["x86", "Arm"])
def test_the_cpu_that_choices_are_kept_under_is_its_first_processors_model_name_family_and_model(
        tmp_path, monkeypatch, cpuinfo, expected):
    import platform

    (tmp_path / "cpuinfo").write_text(cpuinfo, encoding="utf-8")
    monkeypatch.setattr(kernels, "Path", lambda path: tmp_path / "cpuinfo" if path == "/proc/cpuinfo" else Path(path))
    monkeypatch.setattr(platform, "processor", lambda: "aarch64")
    assert kernels.cpu_name() == expected.format(processor="aarch64")


def test_a_cache_folder_a_file_cannot_be_written_in_is_one_line_naming_it(tmp_path, monkeypatch):
    """The folder is there (made by another user, read-only): a file written in it is the test."""
    import errno
    import tempfile

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refused)
    with pytest.raises(kernels.CacheNotWritable) as refusal:
        kernels.writable(tmp_path)
    assert str(refusal.value) == (f"vaswani_hf cannot write its cache {tmp_path} (Permission denied): set "
                                  "VASWANI_HF_CACHE to a folder it can write")


def test_processes_that_need_the_same_choice_at_once_measure_it_once(tmp_path):
    """Runs started together (a sweep on one machine) take one plan: while one process measures, another that needs
    the same choice waits, then reads what the first kept (kernels.kept_apart)."""
    import multiprocessing
    import os
    import time

    from vaswani_hf.speed.kernels import kept_apart

    def measure(names):
        with open(tmp_path / "measured", "a", encoding="utf-8") as record:
            record.write(f"{os.getpid()}\n")
        time.sleep(1)  # long enough for the other process to ask meanwhile
        return {name: {"choice": os.getpid()} for name in names}

    def need(index):
        found = kept_apart(tmp_path / "cache", {"greedy": {"sizes": 1}}, "choice", measure)
        (tmp_path / f"found{index}").write_text(json.dumps(found), encoding="utf-8")

    processes = [multiprocessing.get_context("fork").Process(target=need, args=(index,)) for index in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert [process.exitcode for process in processes] == [0, 0]
    (measurer,) = (tmp_path / "measured").read_text(encoding="utf-8").split()
    found = {(tmp_path / f"found{index}").read_text(encoding="utf-8") for index in range(2)}
    assert found == {json.dumps({"greedy": int(measurer)})}


def encoder_rows(model, source, num_beams):
    """Rows of the encoder output whose cross-attention keys are computed, in generate(num_beams)."""
    rows = []
    hook = model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(
        lambda module, args, output: rows.append(args[0].shape[0]))
    try:
        model.generate(source, num_beams=num_beams, max_new_tokens=3)
    finally:
        hook.remove()
    return set(rows)


@pytest.mark.parametrize("given", ["argument", "generation config"])
@pytest.mark.parametrize(("mode", "num_beams"), [("greedy", 1), ("beam", 2), ("beam", 4)])
@pytest.mark.parametrize("packed", [False, True])
def test_generate_takes_the_mechanisms_its_plan_names_for_the_mode(mode, num_beams, packed, given):
    """The mode is the call's: its num_beams, as an argument or in the generation config it passes."""
    from transformers import GenerationConfig

    plan = {**PLAIN, mode: {**PLAIN[mode], "packed": packed}}
    model, source = fast_cpu(tiny_model(seed=6), plan).eval(), random_ids(3, 8, seed=4)

    def generate(beams):
        if given == "argument":
            return model.generate(source, num_beams=beams, max_new_tokens=3)
        return model.generate(source, generation_config=GenerationConfig(num_beams=beams, max_new_tokens=3))

    generate(num_beams)
    assert (model.lm_head in PACKING.packed) == packed
    PACKING.packed.clear()
    generate(1 if mode == "beam" else 4)
    assert model.lm_head not in PACKING.packed  # the other mode's plan is plain


@pytest.mark.parametrize("shared", [False, True])
def test_beams_share_their_source_row_only_where_the_plan_says(shared):
    model = fast_cpu(tiny_model(seed=6), {**PLAIN, "beam": {"shared": shared, "packed": False}})
    assert encoder_rows(model.eval(), random_ids(3, 8, seed=4), num_beams=4) == ({3} if shared else {12})


# --- whatever the plan, the model computes the same --------------------------------------------------------------

def test_a_model_whose_plan_trains_as_torch_does_trains_as_the_plain_one_bit_for_bit(monkeypatch):
    """In torch's products, though it packs for decoding (oneDNN's can give the same bits at these sizes)."""
    source, labels = random_ids(4, 9, seed=1), random_ids(4, 6, seed=2)
    real, products = kernels.onednn_product, []
    monkeypatch.setattr(kernels, "onednn_product", lambda *args: products.append(args) or real(*args))
    gradients = []
    for transform in (lambda m: m, lambda m: fast_cpu(m, {**EVERYTHING, "training": {"onednn": False}})):
        model = transform(tiny_model(seed=4)).train()
        torch.manual_seed(0)  # the same dropout masks
        with PACKING.block():
            model(input_ids=source, labels=labels).loss.backward()
        gradients.append({name: parameter.grad for name, parameter in model.named_parameters()})
    assert gradients[1].keys() == gradients[0].keys() and products == []
    assert all(torch.equal(gradients[1][name], gradients[0][name]) for name in gradients[0])


def decode(model, source, **kwargs):
    return model.generate(source, max_new_tokens=10, output_scores=True, return_dict_in_generate=True, **kwargs)


@pytest.mark.parametrize(("num_beams", "search"), [
    (1, {}), (4, {}), (4, {"gnmt_alpha": 0.6, "num_return_sequences": 2})])
def test_decoding_gives_the_same_sequences_and_scores_whatever_the_plan(num_beams, search):
    """Greedy, transformers' beam search, and the paper's, whose scores come from a pass over the 2 hypotheses a
    source it returns without a cache (rows that are not the beams sharing a source)."""
    source = random_ids(3, 8, seed=3)
    plain = decode(tiny_model(seed=5).eval(), source, num_beams=num_beams, **search)
    for plan in (PLAIN, EVERYTHING, {**PLAIN, "beam": {"shared": True, "packed": False}}):
        other = decode(fast_cpu(tiny_model(seed=5), plan).eval(), source, num_beams=num_beams, **search)
        assert torch.equal(other.sequences, plain.sequences), plan
        torch.testing.assert_close(torch.stack(other.scores), torch.stack(plain.scores), rtol=1e-5, atol=1e-5)


def test_a_cache_that_generate_returns_or_takes_has_transformers_layout_and_the_model_is_plain_after():
    """Beams that share their source keep one cross-attention row a source during the call only: the cache the call
    returns holds a row per sequence, as the plain model's; given back to generate(), it continues as the plain
    model's does; and the model's next forward computes as the plain model's."""
    source = random_ids(3, 8, seed=3)
    models = [tiny_model(seed=5).eval(), fast_cpu(tiny_model(seed=5), {**PLAIN, "beam": {"shared": True,
                                                                                         "packed": False}}).eval()]
    first = [model.generate(source, num_beams=4, max_new_tokens=4, return_dict_in_generate=True) for model in models]
    caches = [[layer.keys for layer in output.cache.cross_attention_cache.layers] for output in first]
    assert [keys.shape[0] for keys in caches[1]] == [12] * 3
    assert all(torch.equal(ours, plain) for ours, plain in zip(caches[1], caches[0], strict=True))
    then = [model.generate(source, decoder_input_ids=output.sequences, cache=copy.deepcopy(output.cache), num_beams=4,
                           max_new_tokens=3, output_scores=True, return_dict_in_generate=True)
            for model, output in zip(models, first, strict=True)]
    assert torch.equal(then[1].sequences, then[0].sequences)
    torch.testing.assert_close(torch.stack(then[1].scores), torch.stack(then[0].scores), rtol=1e-5, atol=1e-5)
    plain, ours = (model(input_ids=source, decoder_input_ids=source[:, :5]).logits for model in models)
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call", ["source by position, cache=", "input_ids=, past_key_values="])
def test_a_cache_given_to_generate_holds_a_row_a_source_while_the_call_runs(call):
    """Beams that share their source: a cache given in transformers' layout (a row per sequence), filled by an earlier
    call or fresh, holds one cross-attention row a source during the call, under either name of the call's inputs."""
    import warnings

    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    source = random_ids(3, 8, seed=3)
    model = fast_cpu(tiny_model(seed=5), {**PLAIN, "beam": {"shared": True, "packed": False}}).eval()
    first = model.generate(source, num_beams=4, max_new_tokens=4, return_dict_in_generate=True)
    rows = []
    model.model.decoder.layers[0].encoder_attn.register_forward_pre_hook(lambda module, args, kwargs: rows.append(
        kwargs["cache"].cross_attention_cache.layers[0].keys.shape[0] if kwargs["cache"].is_updated.get(0) else None),
        with_kwargs=True)
    fresh = EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))
    for cache, sequences in ((copy.deepcopy(first.cache), first.sequences), (fresh, None)):
        rows.clear()
        inputs = ((source,), {"cache": cache}) if call.startswith("source") else (
            (), {"input_ids": source, "past_key_values": cache})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # past_key_values: transformers' name before `cache`
            model.generate(*inputs[0], **inputs[1], decoder_input_ids=sequences, num_beams=4, max_new_tokens=3)
        assert len(rows) == 3 and set(rows[1:]) == {3} and rows[0] == (3 if sequences is not None else None)


def test_beam_search_with_a_self_attention_cache_alone_finds_the_plain_models_beams():
    """A DynamicCache given to generate() (no cross-attention cache: the keys of the source computed at every step) is
    reordered with the beams as the plain model's."""
    from transformers.cache_utils import DynamicCache

    source = random_ids(3, 8, seed=3)
    found = [model.generate(source, num_beams=4, max_new_tokens=6, cache=DynamicCache(config=model.config))
             for model in (tiny_model(seed=5), fast_cpu(tiny_model(seed=5), {**PLAIN, "beam": {"shared": True,
                                                                                          "packed": False}}))]
    assert torch.equal(found[1], found[0])


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_beams_that_share_their_source_attend_as_the_plain_model_at_several_positions_at_once(attention):
    """A forward of four beams a source over five target positions (a call's first step after a given cache has
    several): logits and, with the eager kernel, the encoder-decoder attention weights of every beam are the plain
    model's; in eval mode the attention dropout (0.3 here) is off in both."""
    source, mask = padded_source()
    plain, model = (tiny_model(seed=5, attn_implementation=attention, dropout=0.3, attention_dropout=0.3)
                    for _ in range(2))
    model = fast_cpu(model, {**PLAIN, "beam": {"shared": True, "packed": False}}).eval()
    encoded = plain.get_encoder()(input_ids=source, attention_mask=mask).last_hidden_state
    inputs = {"encoder_outputs": (encoded.repeat_interleave(4, 0),), "attention_mask": mask.repeat_interleave(4, 0),
              "decoder_input_ids": random_ids(12, 5, seed=7), "output_attentions": attention == "eager"}
    expected = plain(**inputs)
    with model.fast_decoding(4) as shared:
        found = model(**inputs)
    assert shared
    torch.testing.assert_close(found.logits, expected.logits, rtol=1e-5, atol=1e-5)
    for ours, plains in zip(found.cross_attentions or (), expected.cross_attentions or (), strict=True):
        torch.testing.assert_close(ours, plains, rtol=1e-5, atol=1e-6)


# --- the lean step ----------------------------------------------------------------------------------------------

def with_lean(lean: bool, shared: bool = True, packed: bool = False) -> dict:
    return {**PLAIN, "greedy": {"lean": lean, "packed": packed},
            "beam": {"shared": shared, "lean": lean, "packed": packed}}


def padded_source():
    """Three sources of 9 tokens, two of them padded."""
    source, mask = random_ids(3, 9, seed=3), torch.ones(3, 9, dtype=torch.long)
    mask[1, 5:], mask[2, 2:] = 0, 0
    return source.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("num_beams", [1, 4])
@pytest.mark.parametrize(("shared", "packed"), [(False, False), (True, False), (True, True)])
def test_the_lean_step_decodes_as_the_decoders_own_forward_bit_for_bit(normalize_before, num_beams, shared, packed):
    """The same plan without the lean step is the reference: the same sequences and every step's scores, bit for bit,
    post-LN and pre-LN, padded sources, greedy and beam 4, beams sharing their source or not, packed or not; values
    of another width than keys (d_v 12, d_k 8)."""
    source, mask = padded_source()
    outputs = [decode(fast_cpu(tiny_model(seed=5, normalize_before=normalize_before, d_v=12),
                               with_lean(lean, shared, packed)),
                      source, attention_mask=mask, num_beams=num_beams) for lean in (False, True)]
    assert torch.equal(outputs[1].sequences, outputs[0].sequences)
    assert all(torch.equal(lean, own) for lean, own in zip(outputs[1].scores, outputs[0].scores, strict=True))


def test_the_papers_search_with_the_lean_step_finds_what_it_finds_without():
    source, mask = padded_source()
    found = [fast_cpu(tiny_model(seed=5), with_lean(lean)).generate(
        source, attention_mask=mask, num_beams=4, gnmt_alpha=0.6, max_new_tokens=10, output_scores=True,
        return_dict_in_generate=True) for lean in (False, True)]
    assert torch.equal(found[1].sequences, found[0].sequences)
    assert torch.equal(found[1].sequences_scores, found[0].sequences_scores)


def own_forward_calls(monkeypatch, model) -> list:
    """The calls of the decoder's own forward (the class's), recorded from now on."""
    calls, decoder_class = [], type(model.get_decoder())
    monkeypatch.setattr(decoder_class, "forward", counting(calls, "own", decoder_class.forward))
    return calls


@pytest.mark.parametrize("mode", ["greedy", "beam"])
def test_the_lean_step_takes_every_step_after_the_first_of_the_mode_its_plan_names(monkeypatch, mode):
    plan = {**PLAIN, mode: {**PLAIN[mode], "lean": True}}
    model, source = fast_cpu(tiny_model(seed=6), plan), random_ids(3, 8, seed=4)
    calls = own_forward_calls(monkeypatch, model)
    for num_beams in (1, 4):
        calls.clear()
        model.generate(source, num_beams=num_beams, min_new_tokens=5, max_new_tokens=5)
        assert len(calls) == (1 if (num_beams > 1) == (mode == "beam") else 5)
        assert "forward" not in vars(model.get_decoder())  # the decoder's own forward is back after the call


@pytest.mark.parametrize("what", ["hidden states", "eager kernel", "another sdpa kernel", "a decoder mask",
                                  "training mode"])
def test_the_decoders_own_forward_takes_every_step_the_lean_one_does_not_compute(monkeypatch, what):
    """Recorded hidden states, a kernel other than transformers' SDPA, a decoder attention mask, training mode (the
    lean step has no dropout; here P_drop is 0, so the plain model decodes alike): the decoder's own forward runs
    every step, and the call gives what the plain model gives."""
    attention = "eager" if what == "eager kernel" else "sdpa"
    model = fast_cpu(tiny_model(seed=6, attn_implementation=attention), with_lean(True, shared=False))
    plain, source = tiny_model(seed=6, attn_implementation=attention), random_ids(3, 8, seed=4)
    for each in (model, plain):
        each.train(what == "training mode")
    if what == "another sdpa kernel":
        monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", functools.partial(ALL_ATTENTION_FUNCTIONS["sdpa"]))
    options = {"output_hidden_states": what == "hidden states", "min_new_tokens": 10}  # decode(): at most 10
    if what == "a decoder mask":
        options["decoder_attention_mask"] = torch.ones(3, 1, dtype=torch.long)
    expected = decode(plain, source, **options)
    calls = own_forward_calls(monkeypatch, model)
    found = decode(model, source, **options)
    assert len(calls) == 10
    assert torch.equal(found.sequences, expected.sequences)
    if what == "hidden states":
        assert all(torch.equal(torch.stack(ours), torch.stack(theirs))
                   for ours, theirs in zip(found.decoder_hidden_states, expected.decoder_hidden_states, strict=True))


def test_a_first_step_of_several_tokens_after_a_given_cache_goes_to_the_decoders_own_forward(monkeypatch):
    """generate() continuing from a cache it returned, with the sequences so far: its first step feeds several tokens
    a row to a filled cache, which the lean step does not compute; the continuation is the plain model's."""
    source = random_ids(3, 8, seed=4)
    models = [tiny_model(seed=6), fast_cpu(tiny_model(seed=6), with_lean(True, shared=False))]
    first = [model.generate(source, max_new_tokens=4, return_dict_in_generate=True) for model in models]

    def then(model, output):
        return model.generate(source, decoder_input_ids=output.sequences, cache=copy.deepcopy(output.cache),
                              max_new_tokens=3, min_new_tokens=3)

    expected = then(models[0], first[0])
    calls = own_forward_calls(monkeypatch, models[1])
    assert torch.equal(then(models[1], first[1]), expected)
    assert len(calls) == 1  # the first step; the lean one computes the two after it


def test_inside_a_lean_block_the_decoders_own_checks_speak():
    """A step that does not match its source (rows, mask) goes to the decoder's own forward, whose one-line errors
    name what is wrong; blocks nest."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    from vaswani_hf.speed.lean import lean_block

    model = fast_cpu(tiny_model(seed=2), with_lean(True, shared=False))
    decoder, source = model.get_decoder(), random_ids(3, 6, seed=1)
    encoded = model.get_encoder()(source).last_hidden_state  # (3, 6, D)
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    with torch.no_grad(), lean_block(decoder), lean_block(decoder):
        decoder(input_ids=random_ids(3, 1, seed=2), encoder_hidden_states=encoded, cache=cache)  # fills the cache
        with pytest.raises(ValueError, match=r"^the decoder has 2 rows but the encoder output 3: give one"):
            decoder(input_ids=random_ids(2, 1, seed=2), encoder_hidden_states=encoded, cache=cache)
        with pytest.raises(ValueError, match=r"^the decoder has 3 rows but the encoder output 2: give one"):
            decoder(input_ids=random_ids(3, 1, seed=2), encoder_hidden_states=encoded[:2], cache=cache)
        with pytest.raises(ValueError, match=r"^attention_mask has shape \(3, 5\) but the source needs \(3, 6\)"):
            decoder(input_ids=random_ids(3, 1, seed=2), encoder_hidden_states=encoded,
                    encoder_attention_mask=torch.ones(3, 5), cache=cache)
        with pytest.raises(ValueError, match=r"^Give exactly one of decoder_input_ids and the matching inputs_embeds"):
            decoder(input_ids=random_ids(3, 1, seed=2), inputs_embeds=torch.zeros(3, 1, model.config.d_model),
                    encoder_hidden_states=encoded, cache=cache)
    assert "forward" not in vars(decoder)


def test_inside_a_lean_block_a_decoder_whose_config_records_attentions_records_them():
    """`output_attentions` in the model's config, not in the call: the decoder's own forward records them."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    from vaswani_hf.speed.lean import lean_block

    steps = []
    for model in (tiny_model(seed=2, output_attentions=True),
                  fast_cpu(tiny_model(seed=2, output_attentions=True), with_lean(True, shared=False))):
        decoder, source = model.get_decoder(), random_ids(3, 6, seed=1)
        encoded = model.get_encoder()(source).last_hidden_state
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        with torch.no_grad(), lean_block(decoder):
            for seed in (2, 3):  # the second step: the cross-attention cache filled
                step = decoder(input_ids=random_ids(3, 1, seed=seed), encoder_hidden_states=encoded, cache=cache)
        steps.append(step)
    assert steps[1].attentions is not None and steps[1].cross_attentions is not None
    for ours, theirs in zip(steps[1].attentions + steps[1].cross_attentions,
                            steps[0].attentions + steps[0].cross_attentions, strict=True):
        assert torch.equal(ours, theirs)


def test_a_plan_kept_before_the_lean_step_is_taken_with_it_off():
    kept = {"greedy": {"packed": False}, "beam": {"shared": True, "packed": True}, "training": {"onednn": False}}
    model = fast_cpu(tiny_model(), kept)
    assert model.fast_cpu_plan == {"greedy": {"lean": False, "packed": False}, "training": {"onednn": False},
                                   "beam": {"shared": True, "lean": False, "packed": True}}


@pytest.mark.parametrize(("plan", "packing"), [(PLAIN, False), (with_lean(True), False),
                                               ({**PLAIN, "beam": {"shared": True, "packed": True}}, True),
                                               ({**PLAIN, "training": {"onednn": True}}, True)])
def test_linear_layers_are_torchs_unless_the_plan_packs_or_trains_in_onednn(plan, packing):
    """torch's `nn.Linear` costs less Python per call than `PackedLinear`; a plan that leaves packing frees the
    copies packed before."""
    model = fast_cpu(tiny_model(seed=6), EVERYTHING)
    decode(model, random_ids(3, 8, seed=4))
    assert model.lm_head in PACKING.packed
    fast_cpu(model, plan)
    linear = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
    assert {type(module) for module in linear} == {PackedLinear if packing else torch.nn.Linear}
    assert (model.lm_head in PACKING.packed) == packing


# --- packed weights ----------------------------------------------------------------------------------------------

def test_a_weight_fingerprint_samples_inside_the_weight_at_every_size():
    """The base model's output projection (37000 x 512) is where float32 sample positions ran past the end."""
    for shape in [(1,), (3, 5), (37000, 512), (64,), (65,)]:
        weight = torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)  # exact indices
        samples = fingerprint(weight)[2]
        assert samples[0] == 0 and samples[-1] == weight.numel() - 1 and len(samples) == min(64, weight.numel())


def plain_twin(model):
    twin = copy.deepcopy(model)
    twin.fast_cpu_plan = PLAIN
    return twin


def test_packed_weights_are_kept_between_calls_in_eval_mode_and_never_go_stale():
    model, source = fast_cpu(tiny_model(seed=6), EVERYTHING).eval(), random_ids(3, 8, seed=4)
    decode(model, source)
    kept = PACKING.packed[model.lm_head][3]
    decode(model, source)
    assert PACKING.packed[model.lm_head][3] is kept  # packed once for both calls

    with torch.no_grad():  # change the weights in place between two calls: the second must use the new ones
        for module in model.modules():
            if isinstance(module, PackedLinear):
                module.weight.mul_(-1.5)
    fast = decode(model, source)
    assert PACKING.packed[model.lm_head][3] is not kept
    plain = decode(plain_twin(model), source)
    assert torch.equal(fast.sequences, plain.sequences)
    torch.testing.assert_close(torch.stack(fast.scores), torch.stack(plain.scores), rtol=1e-5, atol=1e-5)

    with torch.no_grad():  # one value the fingerprint does not sample (it takes flat indices 0, 20, ...): its version
        model.lm_head.weight[0, 1] += 5.0
    fast = decode(model, source)
    plain = decode(plain_twin(model), source)
    torch.testing.assert_close(torch.stack(fast.scores), torch.stack(plain.scores), rtol=1e-5, atol=1e-5)


def test_a_packed_weight_is_checked_once_a_call_not_at_every_step(monkeypatch):
    """Its fingerprint is taken at a call's first step; the steps after it multiply by the copy at once."""
    model, source = fast_cpu(tiny_model(seed=6), EVERYTHING).eval(), random_ids(3, 8, seed=4)
    decode(model, source)
    real, taken = kernels.fingerprint, []
    monkeypatch.setattr(kernels, "fingerprint", lambda weight: taken.append(weight) or real(weight))
    steps = decode(model, source, num_beams=4, min_new_tokens=10).scores  # 10 steps, each through every layer
    assert len(steps) == 10 and len(taken) == sum(isinstance(m, PackedLinear) for m in model.modules())


def test_a_fused_adam_step_between_two_calls_in_eval_mode_is_seen():
    """torch's fused Adam changes the weights in place without counting a version: a kept packed copy must not
    survive it, even with the model left in eval mode (no training forward to free the copies)."""
    model, source = fast_cpu(tiny_model(seed=6), EVERYTHING).eval(), random_ids(3, 8, seed=4)
    decode(model, source)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05, fused=True)
    version = model.lm_head.weight._version
    model(input_ids=source, labels=source).loss.backward()
    optimizer.step()
    assert model.lm_head.weight._version == version  # the premise: the update went uncounted
    fast = decode(model, source)
    plain = decode(plain_twin(model), source)
    assert torch.equal(fast.sequences, plain.sequences)
    torch.testing.assert_close(torch.stack(fast.scores), torch.stack(plain.scores), rtol=1e-5, atol=1e-5)


def test_a_training_forward_frees_the_packed_weights_and_a_generate_in_training_mode_keeps_none():
    model, source = fast_cpu(tiny_model(seed=6), EVERYTHING).eval(), random_ids(3, 8, seed=4)
    decode(model, source)
    linear_layers = [module for module in model.modules() if isinstance(module, PackedLinear)]
    assert all(module in PACKING.packed for module in linear_layers)
    model.train()(input_ids=source, labels=source)
    assert not any(module in PACKING.packed for module in linear_layers)
    decode(model, source)  # in training mode
    assert not any(module in PACKING.packed for module in linear_layers)


def test_packing_blocks_nest():
    """A decoding loop inside another (the GNMT search inside the translator) leaves the outer block open."""
    with PACKING.block():
        with PACKING.block():
            assert PACKING.open == 2
        assert PACKING.open == 1
    assert PACKING.open == 0


# --- attention ---------------------------------------------------------------------------------------------------

def counting(calls, name, kernel):
    def counted(*args, **kwargs):
        calls.append(name)
        return kernel(*args, **kwargs)
    return counted


@pytest.mark.parametrize("requested", ["sdpa", "eager"])
@pytest.mark.parametrize("transform", [lambda m: m, lambda m: fast_cpu(m, EVERYTHING)])
def test_the_attention_kernel_the_user_names_is_the_one_that_runs(monkeypatch, requested, transform):
    model, source = transform(tiny_model(seed=7, attn_implementation=requested)), random_ids(3, 8, seed=5)
    assert model.config._attn_implementation == requested
    calls = []
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", counting(calls, "sdpa", ALL_ATTENTION_FUNCTIONS["sdpa"]))
    monkeypatch.setattr(modeling_vaswani, "eager_attention_forward",
                        counting(calls, "eager", modeling_vaswani.eager_attention_forward))
    model.generate(source, num_beams=4, max_new_tokens=5)
    assert calls and set(calls) == {requested}


# Pages faulted in by a 64 MiB tensor allocated and written right after an equal one was freed, before and after
# keep_freed_memory() (a fresh process: the setting is for the whole process), 8 times after. The first times after may
# still take fresh pages: torch asks for its blocks 64-byte aligned, which takes glibc a little more than the block, so
# a freed block with a small one after it cannot serve the next, and the heap grows until freed blocks have run
# together (at most 3 times in 150 processes of this probe on a Zen 4); from then on it does not grow. Then the same of
# a block malloc'ed at the heap's top, which glibc gives back to the system when freed unless told to keep it.
REFAULT_PROBE = """
import ctypes, resource, torch
from vaswani_hf import keep_freed_memory

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]

def faults(allocate):
    allocate()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    allocate()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def at_top():
    block = libc.malloc(64 << 20)
    ctypes.memset(block, 1, 64 << 20)
    libc.free(block)

refaults = lambda: faults(lambda: torch.ones(16 << 20))
default, default_at_top = refaults(), faults(at_top)
applied = keep_freed_memory()
print(default, default_at_top, applied, faults(at_top), *[refaults() for _ in range(8)])
"""


def test_keep_freed_memory_lets_a_freed_block_be_reused_without_faulting_its_pages_in_again():
    result = subprocess.run([sys.executable, "-c", REFAULT_PROBE], check=False, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    default, default_at_top, applied, at_top, *kept = result.stdout.split()
    assert applied == "True"  # Linux with glibc, as the machines that run these tests
    assert int(default) > 1000 and all(int(faults) * 100 < int(default) for faults in kept[4:]), (default, kept)
    assert int(default_at_top) > 1000 and int(at_top) * 100 < int(default_at_top), (default_at_top, at_top)


@pytest.mark.parametrize("platform, glibc", [("linux", True), ("linux", False), ("darwin", True), ("win32", True)])
def test_keep_freed_memory_sets_glibcs_two_thresholds_and_nothing_on_another_c_library(monkeypatch, platform, glibc):
    """mallopt(M_MMAP_THRESHOLD = -3, 1 GiB) and mallopt(M_TRIM_THRESHOLD = -1, 1 GiB), as glibc's malloc.h numbers
    them, on Linux with glibc only: another C library (musl) may number them otherwise; Windows has no CDLL(None)."""
    calls = []

    class Libc:
        def mallopt(self, parameter, value):
            calls.append((parameter, value))
            return 1

    if glibc:
        Libc.gnu_get_libc_version = lambda self: b"2.39"
    monkeypatch.setattr(allocator.sys, "platform", platform)
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: Libc())
    applies = platform == "linux" and glibc
    assert keep_freed_memory() is applies
    assert sorted(calls) == ([(-3, 1 << 30), (-1, 1 << 30)] if applies else [])
