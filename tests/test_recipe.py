"""The training recipe's small parts (§5.3, §5.4, §6.1), each against its formula."""

import json
import math
from importlib.metadata import version

import pytest
import torch
from safetensors.torch import save_file

from training import averaging
from training.averaging import average_checkpoints
from training.loss import label_smoothed_nll, plain_label_smoothed_nll
from training.schedule import inverse_sqrt_lr, paper_optimizer


@pytest.mark.parametrize("step, expected", [
    (1, 512**-0.5 * 1 * 4000**-1.5),          # warming up: step · warmup^-1.5
    (4000, 512**-0.5 * 4000**-0.5),           # the peak, about 7.0e-4 for the base model
    (100000, 512**-0.5 * 100000**-0.5),       # decaying: step^-0.5
])
def test_learning_rate_matches_the_formula(step, expected):
    assert inverse_sqrt_lr(step, d_model=512) == pytest.approx(expected, rel=1e-12)
    assert inverse_sqrt_lr(step, d_model=512, scale=2.0) == pytest.approx(2 * expected, rel=1e-12)


def test_the_peak_of_the_base_model_is_7e_4():
    assert inverse_sqrt_lr(4000, 512) == pytest.approx(6.99e-4, abs=1e-6)


def test_the_optimizer_is_adam_098_1e9_and_its_first_update_uses_step_1():
    model = torch.nn.Linear(3, 3)
    optimizer, scheduler = paper_optimizer(model, d_model=512, warmup_steps=4000)
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0.0
    rates = []
    for _ in range(3):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([inverse_sqrt_lr(k, 512, 4000) for k in (1, 2, 3)], rel=1e-12)
    halved, _ = paper_optimizer(model, d_model=512, warmup_steps=4000, scale=0.5)  # --lr_scale 0.5
    assert halved.param_groups[0]["lr"] == pytest.approx(0.5 * 512**-0.5 * 4000**-1.5, rel=1e-12)


def test_the_fused_optimizer_takes_the_steps_of_torchs_default_adam():
    torch.manual_seed(0)
    model, reference = torch.nn.Linear(5, 4), torch.nn.Linear(5, 4)
    reference.load_state_dict(model.state_dict())
    optimizer, _ = paper_optimizer(model, d_model=512, warmup_steps=4)
    assert optimizer.defaults["fused"]
    expected = torch.optim.Adam(reference.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    for step in range(1, 4):
        x = torch.randn(8, 5)
        for module, opt in ((model, optimizer), (reference, expected)):
            module(x).square().sum().backward()
            for group in opt.param_groups:
                group["lr"] = inverse_sqrt_lr(step, 512, 4)
            opt.step()
            opt.zero_grad()
    for parameter, expected_parameter in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(parameter, expected_parameter, rtol=1e-6, atol=1e-7)


def random_logits(seed=0, shape=(2, 5, 11)):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator) * 3


# The loss of an eager step (block by block) and of a compiled one (plain operations, for the compiler to fuse)
BOTH_LOSSES = pytest.mark.parametrize("loss", [label_smoothed_nll, plain_label_smoothed_nll], ids=["blocks", "plain"])


@BOTH_LOSSES
def test_smoothed_loss_at_epsilon_zero_is_plain_nll(loss):
    logits = random_logits()
    labels = torch.tensor([[1, 2, 3, -100, -100], [4, 5, 6, 7, 8]])
    smoothed, nll, count = loss(logits, labels, epsilon=0.0)
    expected = torch.nn.functional.cross_entropy(logits.view(-1, 11), labels.view(-1), reduction="sum")
    torch.testing.assert_close(smoothed, expected)
    torch.testing.assert_close(nll, expected)
    assert count == 8
    padded_with_0 = labels.where(labels != -100, 0)  # padding marked by another id: torch's ignore_index alike
    smoothed, nll, count = loss(logits, padded_with_0, epsilon=0.0, ignore_index=0)
    expected = torch.nn.functional.cross_entropy(logits.view(-1, 11), padded_with_0.view(-1), ignore_index=0,
                                                 reduction="sum")
    torch.testing.assert_close(smoothed, expected)
    torch.testing.assert_close(nll, expected)
    assert count == 8


@BOTH_LOSSES
def test_smoothed_loss_ignores_padding(loss):
    logits = random_logits()
    labels = torch.tensor([[1, 2, 3, -100, -100], [4, 5, 6, 7, 8]])
    changed = logits.clone()
    changed[0, 3:] = 1000.0  # whatever the model says at padded positions
    torch.testing.assert_close(loss(changed, labels)[0], loss(logits, labels)[0])


@BOTH_LOSSES
def test_smoothed_loss_is_the_cross_entropy_against_gold_1_minus_eps_others_eps_over_v_minus_1(loss):
    logits = random_logits(seed=1)
    labels = torch.tensor([[1, 2, 3, 4, -100], [4, 5, 6, 7, 8]])
    epsilon, vocab = 0.1, 11
    target = torch.full((2, 5, vocab), epsilon / (vocab - 1))
    target.scatter_(-1, labels.clamp(min=0).unsqueeze(-1), 1 - epsilon)
    per_token = -(target * logits.log_softmax(-1)).sum(-1)
    expected = per_token[labels != -100].sum()
    torch.testing.assert_close(loss(logits, labels, epsilon)[0], expected)


def smoothed_reference(logits, labels, epsilon):
    """The smoothed loss sum as the formula writes it: -Σ q log_softmax(z) over the kept positions, in float32."""
    vocab = logits.shape[-1]
    target = torch.full(logits.shape, epsilon / (vocab - 1))
    target.scatter_(-1, labels.clamp(min=0).unsqueeze(-1), 1 - epsilon)
    per_token = -(target * logits.float().log_softmax(-1)).sum(-1)
    return per_token.where(labels != -100, 0.0).sum()


@pytest.mark.parametrize("converts_as_it_writes", [False, True], ids=["converted after", "converted as written"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_smoothed_loss_gradient_is_autograds_through_the_formula_block_by_block(dtype, converts_as_it_writes,
                                                                                 monkeypatch):
    """The gradient is computed by hand (softmax - q, block by block: 3 rows at a time, the last block short) in the
    logits' own dtype, written converted as a GPU writes it or converted after as a CPU; autograd through the float32
    formula is the reference, cast as autocast's backward casts it."""
    monkeypatch.setattr("training.loss.converts_as_it_writes", lambda tensor: converts_as_it_writes)
    logits = random_logits(seed=2, shape=(2, 5, 13)).to(dtype).requires_grad_()
    labels = torch.tensor([[1, 2, 3, -100, -100], [4, 5, 6, 7, 12]])
    reference = logits.detach().clone().requires_grad_()
    smoothed, _, _ = label_smoothed_nll(logits, labels, 0.1, chunk_rows=3)
    expected = smoothed_reference(reference, labels, 0.1)
    torch.testing.assert_close(smoothed, expected)
    (0.37 * smoothed).backward()
    (0.37 * expected).backward()
    assert logits.grad.dtype == dtype
    torch.testing.assert_close(logits.grad, reference.grad)
    torch.testing.assert_close(logits, reference)  # the logits themselves untouched
    assert logits.grad[0, 3:].abs().max() == 0  # ignored positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_plain_loss_gradient_is_autograds_through_the_formula(dtype):
    """The compiled step's loss, differentiated by autograd through its own operations (the gold logit picked by a
    comparison, not `gather`), against the formula written with q, in the logits' dtype."""
    logits = random_logits(seed=2, shape=(2, 5, 13)).to(dtype).requires_grad_()
    labels = torch.tensor([[1, 2, 3, -100, -100], [4, 5, 6, 7, 12]])
    reference = logits.detach().clone().requires_grad_()
    smoothed, nll, count = plain_label_smoothed_nll(logits, labels, 0.1)
    expected = smoothed_reference(reference, labels, 0.1)
    torch.testing.assert_close(smoothed, expected)
    (0.37 * smoothed).backward()
    (0.37 * expected).backward()
    assert logits.grad.dtype == dtype and not nll.requires_grad and count == 8
    torch.testing.assert_close(logits.grad, reference.grad)


def test_the_compiled_plain_loss_is_the_eager_loss_without_a_float32_copy_of_the_logits(monkeypatch):
    """What a compiled step gains: inductor fuses the plain loss, forward and backward, so that nothing the size of the
    logits is made in float32 (every buffer inductor allocates is recorded, at this run's sizes), with the loss and
    the gradient of the eager step's blocks. Sizes symbolic, as the step compiles them."""
    allocations = []
    allocate = torch._C._dynamo.guards._empty_strided_cpu  # what inductor's generated code allocates with

    def recorded(size, stride, dtype, *rest):
        allocations.append((math.prod(size), dtype))
        return allocate(size, stride, dtype, *rest)

    monkeypatch.setattr(torch._C._dynamo.guards, "_empty_strided_cpu", recorded)
    # Two kernels to compile: precompiling inductor's headers first costs more than it saves (benchmarks/README.md).
    monkeypatch.setattr(torch._inductor.config, "cpp_cache_precompile_headers", False)
    torch._dynamo.reset()
    logits = random_logits(seed=4, shape=(3, 7, 29)).bfloat16().requires_grad_()
    labels = torch.randint(0, 29, (3, 7), generator=torch.Generator().manual_seed(4))
    labels[0, 4:] = -100
    reference = logits.detach().clone().requires_grad_()
    compiled = torch.compile(plain_label_smoothed_nll, backend="inductor", dynamic=True)(logits, labels, 0.1)
    compiled[0].backward()
    expected = label_smoothed_nll(reference, labels, 0.1)
    expected[0].backward()
    for got, want in zip(compiled, expected):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(logits.grad, reference.grad)
    assert (logits.numel(), torch.bfloat16) in allocations  # the gradient: the recording saw inductor's buffers
    assert max(numel for numel, dtype in allocations if dtype == torch.float32) <= labels.numel()


def test_smoothed_loss_makes_no_float32_copy_of_the_whole_logits():
    """At the paper's batch the logits are 25,000 x 37,000: the forward and backward convert one block of rows to
    float32 at a time (here 4 of 30 rows), never the whole tensor, as log_softmax of logits.float() would."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestFloat32(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, tuple | list) else [out]:
                if isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32:
                    LargestFloat32.largest = max(LargestFloat32.largest, tensor.numel())
            return out

    logits = random_logits(seed=3, shape=(3, 10, 17)).bfloat16().requires_grad_()
    labels = torch.randint(0, 17, (3, 10), generator=torch.Generator().manual_seed(3))
    with LargestFloat32():
        label_smoothed_nll(logits, labels, 0.1, chunk_rows=4)[0].backward()
    assert 0 < LargestFloat32.largest <= 4 * 17


def test_averaged_checkpoints_are_the_element_wise_mean(tmp_path):
    generator = torch.Generator().manual_seed(0)
    checkpoints = [{"w": torch.randn(4, 3, generator=generator), "b": torch.randn(3, generator=generator),
                    "step": torch.tensor(k)} for k in range(5)]
    files = []
    for k, state in enumerate(checkpoints):
        files.append(tmp_path / f"{k}.safetensors")
        save_file(state, str(files[-1]))
    averaged = average_checkpoints(files)
    torch.testing.assert_close(averaged["w"], torch.stack([c["w"] for c in checkpoints]).mean(0))
    torch.testing.assert_close(averaged["b"], torch.stack([c["b"] for c in checkpoints]).mean(0))
    assert averaged["step"].item() == 0  # not floating point: the first checkpoint's
    with pytest.raises(ValueError, match="^average_checkpoints needs at least one checkpoint$"):
        average_checkpoints([])


def test_averaging_sums_in_float64_whatever_the_checkpoints_dtype(tmp_path):
    """2^24, 1 and 1 in float32: a float32 sum loses both ones (2^24 + 1 rounds to 2^24); their mean is 5,592,406,
    which float32 holds exactly."""
    files = []
    for k, value in enumerate((2.0**24, 1.0, 1.0)):
        files.append(tmp_path / f"{k}.safetensors")
        save_file({"w": torch.full((2,), value)}, str(files[-1]))
    averaged = average_checkpoints(files)["w"]
    assert averaged.dtype == torch.float32 and averaged.tolist() == [5_592_406.0] * 2


def test_averaging_streams_and_names_the_checkpoint_that_does_not_fit(tmp_path, monkeypatch):
    """One file open at a time (the float64 sum is all it keeps), and a file with other names or shapes is a
    one-line error naming it."""
    files = []
    for k, state in enumerate([{"w": torch.ones(2, 3)}, {"w": torch.zeros(2, 3)}, {"v": torch.ones(2, 3)},
                               {"w": torch.ones(3, 2)}]):
        files.append(tmp_path / f"checkpoint-{k}.safetensors")
        save_file(state, str(files[-1]))
    open_now, most = 0, 0

    class Counted:
        def __init__(self, *args, **kwargs):
            self.inner = real_safe_open(*args, **kwargs)

        def __enter__(self):
            nonlocal open_now, most
            open_now, most = open_now + 1, max(most, open_now + 1)
            return self.inner.__enter__()

        def __exit__(self, *exc):
            nonlocal open_now
            open_now -= 1
            return self.inner.__exit__(*exc)

    real_safe_open = averaging.safe_open
    monkeypatch.setattr(averaging, "safe_open", Counted)
    averaged = average_checkpoints(files[:2] * 5)
    torch.testing.assert_close(averaged["w"], torch.full((2, 3), 0.5))
    assert most == 1
    with pytest.raises(ValueError, match=r"checkpoint-2.safetensors does not fit .*checkpoint-0.safetensors: it holds "
                                         r"other weights \(v, w\)"):
        average_checkpoints(files[:3])
    with pytest.raises(ValueError,
                       match=r"checkpoint-3.safetensors does not fit .*: w has shape \(3, 2\), not \(2, 3\)"):
        average_checkpoints([files[0], files[3]])


@pytest.mark.parametrize("candidates", [[1.0], [1.0, 0.2]])
def test_alpha_is_chosen_among_the_candidates_even_one_that_is_not_the_default(translation_folder, candidates):
    """§6.1: α chosen on validation. The candidates need not include --length_penalty_alpha (cpu-medium's 1.4):
    the saved α and the test set's decoding are the best candidate's, scored as the evaluation scores them."""
    from types import SimpleNamespace

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from training.batching import encode
    from training.default_data import generate
    from training.evaluation import final_evaluation, score, translate

    model = AutoModelForSeq2SeqLM.from_pretrained(translation_folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    pairs = {"validation": generate()["validation"][:6], "test": generate()["test"][:4]}
    args = SimpleNamespace(alpha_candidates=candidates, length_penalty_alpha=1.4, num_beams=3, max_tokens=400,
                           evalb=False)
    metrics, alpha = final_evaluation(model, tokenizer, pairs, encode(tokenizer, pairs["validation"]), args, print,
                                      "de")

    def bleu(split, alpha):
        sources, references = zip(*pairs[split])
        return score(translate(model, tokenizer, list(sources), num_beams=3, alpha=alpha), list(references))["bleu"]

    best = max(candidates, key=lambda alpha: bleu("validation", alpha))
    assert alpha == best and args.length_penalty_alpha == 1.4  # returned, the flags untouched
    assert ("alpha_search" in metrics) == (len(candidates) > 1)  # no search of one
    assert not model.training  # the validation loss gave the model its mode back
    assert metrics["validation"]["bleu"] == bleu("validation", best)
    assert metrics["test"]["bleu"] == bleu("test", best)


def test_a_diverged_validation_loss_reports_a_capped_perplexity_not_an_overflow(translation_folder, monkeypatch):
    """A run whose loss blew up (above 709, where exp overflows a float) still validates: its perplexity is e^50."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from training import evaluation

    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    monkeypatch.setattr(evaluation, "validation_loss", lambda *args: 1000.0)
    monkeypatch.setattr(evaluation, "translate", lambda model, tokenizer, sources, **kwargs: list(sources))
    args = SimpleNamespace(max_tokens=400, eval_max_sentences=2, num_beams=4, length_penalty_alpha=0.6, evalb=False)
    pairs = [("Ein Hund läuft über die Wiese.",) * 2, ("Eine Katze schläft auf dem Dach.",) * 2, ("Ungelesen.", "-")]
    metrics = evaluation.evaluate_model(torch.nn.Linear(1, 1), tokenizer, pairs, ([], []), args)
    assert (metrics["loss"], metrics["perplexity"]) == (1000.0, math.exp(50))
    assert metrics["bleu"] == pytest.approx(100)  # the first --eval_max_sentences pairs alone


def test_the_final_evaluation_reports_the_best_alphas_scores_and_the_unsmoothed_validation_loss(translation_folder,
                                                                                                monkeypatch):
    """§6.1's α search, wired: translations (a stand-in) are right only with α = 0.2, the middle candidate, so the
    chosen α, the validation and test scores must all be 0.2's. The validation loss is the plain per-token NLL
    over every token (torch's cross-entropy, no smoothing; batches of 30 tokens at most, of unequal sizes) and the
    perplexity its exponential, of an untrained model (loss above 5)."""
    from types import SimpleNamespace

    from support import tiny_model
    from transformers import AutoTokenizer

    from training import evaluation
    from training.batching import encode
    from training.default_data import generate

    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    model = tiny_model(seed=3, vocab_size=len(tokenizer))
    with torch.no_grad():
        model.lm_head.weight.mul_(8)  # confidently wrong: a loss well above 5
    pairs = {"validation": generate()["validation"][:6], "test": generate()["test"][:4]}
    reference = dict(pairs["validation"] + pairs["test"])
    monkeypatch.setattr(evaluation, "translate", lambda model, tokenizer, sources, num_beams, alpha: [
        reference[source] if alpha == 0.2 else "das ist es nicht" for source in sources])
    args = SimpleNamespace(alpha_candidates=[1.0, 0.2, 0.6], length_penalty_alpha=0.6, num_beams=4, max_tokens=30,
                           evalb=False)
    encoded = encode(tokenizer, pairs["validation"])
    metrics, alpha = evaluation.final_evaluation(model, tokenizer, pairs, encoded, args, print, "de")

    search = metrics["alpha_search"]
    assert alpha == 0.2 and search[0.2] == pytest.approx(100) and search[1.0] < 1 and search[0.6] < 1
    for split in ("validation", "test"):  # the winner's scores, Table 2's BLEU with them
        assert metrics[split]["bleu"] == pytest.approx(100) == metrics[split]["bleu_tokenized"]
    total = count = 0
    for source, target in zip(*encoded):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([source]), labels=torch.tensor([target])).logits[0]
        total += torch.nn.functional.cross_entropy(logits, torch.tensor(target), reduction="sum").item()
        count += len(target)
    assert metrics["validation"]["loss"] == pytest.approx(total / count, rel=1e-5) and total / count > 5
    assert metrics["validation"]["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-5)


# Moses' tokenizer.perl and multi-bleu.perl as of 2016-12-23 (mosesdecoder 59119c0, the version of the paper's time),
# with tensor2tensor's get_ende_bleu.sh compound split, ran on these lines: each line's tokens, and the corpus BLEU.
TABLE2_CASES = {
    "de": ([("Ein Mann mit grauen Haaren rasiert sich den Bart.",
             "Ein Mann mit ergrauenden Haaren rasiert seinen Bart.",
             "Ein Mann mit ergrauenden Haaren rasiert seinen Bart."),  # a line's last word keeps its known period
            ("Die 3-jährige Tochter schreibt eine E-Mail Adresse auf.",
             "Die 3-jährige Tochter schreibt eine E-Mail-Adresse auf.",
             "Die 3 ##AT##-##AT## jährige Tochter schreibt eine E ##AT##-##AT## Mail ##AT##-##AT## Adresse auf ."),
            ("Der Spieler mit Nummer 10.", "Der Spieler mit der Nummer 10.", "Der Spieler mit der Nummer 10."),
            ('Er sagte: "Das ist z.B. ein rot-weiß-blauer Ball" und ging.',
             'Er sagte: "Das ist z.B. ein rot-weiß-blauer Ball", und ging.',
             ("Er sagte : &quot; Das ist z.B. ein rot ##AT##-##AT## weiß ##AT##-##AT## blauer Ball &quot; , "
              "und ging .")),
            ("Sie zahlt 3,5 Euro und bekommt zwei grüne Äpfel.",
             "Sie zahlt 3,5 Euro & bekommt <zwei> Äpfel (grüne).",
             "Sie zahlt 3,5 Euro &amp; bekommt &lt; zwei &gt; Äpfel ( grüne ) ."),
            ("Dr. Müllers Hund läuft über die Nord-Süd-Brücke.",
             "Dr. Müller's Hund läuft über die Nord-Süd-Brücke.",
             "Dr. Müller &apos; s Hund läuft über die Nord ##AT##-##AT## Süd ##AT##-##AT## Brücke ."),
            ("Kinder spielen im Schnee-es ist kalt!", "Kinder spielen im Schnee - es ist kalt!",
             "Kinder spielen im Schnee - es ist kalt !"),
            ("Ein Hund springt über den Zaun und bellt.", "Ein Hund springt über einen Zaun … und bellt.",
             "Ein Hund springt über einen Zaun … und bellt .")], 60.14),
    "fr": ([("L'homme dit qu'il vient aujourd'hui à 10 h.", "L'homme dit qu'il viendra aujourd'hui à 10 h.",
             "L&apos; homme dit qu&apos; il viendra aujourd&apos; hui à 10 h."),
            ("C'est un vice président très connu.", "C'est un vice-président très « connu ».",
             "C&apos; est un vice ##AT##-##AT## président très « connu » ."),
            ("Le chat-huant regarde l'arc-en-ciel.", "Le chat-huant regarde l'arc-en-ciel.",
             "Le chat ##AT##-##AT## huant regarde l&apos; arc ##AT##-##AT## en ##AT##-##AT## ciel .")], 70.52),
}


@pytest.mark.parametrize("lang", TABLE2_CASES)
def test_table_2s_bleu_is_moses_tokens_compounds_split_and_multi_bleu(lang):
    """The paper's BLEU (tokenized, compound-split) as tensor2tensor's get_ende_bleu.sh computes it with Moses'
    scripts of the paper's time: the references' tokens as tokenizer.perl and the split give them, and the corpus BLEU
    as multi-bleu.perl prints it (2 decimals), beside sacreBLEU's own scores."""
    from training.evaluation import score
    from training.metrics.sacrebleu_chrf.sacrebleu_chrf import table2_tokens

    rows, bleu = TABLE2_CASES[lang]
    hypotheses, references, tokens = (list(column) for column in zip(*rows))
    assert table2_tokens(references, lang) == tokens
    scores = score(hypotheses, references, lang=lang)
    assert round(scores["bleu_tokenized"], 2) == bleu
    assert scores["bleu_tokenized_signature"] == (f"moses:{lang}|compounds:split|sacremoses:{version('sacremoses')}|"
                                                  "nrefs:1|case:mixed|eff:no|tok:none|smooth:none|version:"
                                                  f"{version('sacrebleu')}")
    assert "bleu_tokenized" not in score(hypotheses, references)  # no language named


def test_score_py_scores_a_file_as_a_run_scores_its_test_set(tmp_path, capsys):
    """training/score.py: a file of translations against its references (compressed too), the run's scores and
    signatures (Table 2's BLEU as multi-bleu.perl gave it), in the language `--lang` names; files of unequal length,
    empty, missing or cut short are one line."""
    import gzip

    from training import score as score_py
    from training.evaluation import score

    rows, _ = TABLE2_CASES["fr"]  # --lang: Moses' tokenizer of that language
    (tmp_path / "out.fr").write_text("".join(hypothesis + "\n" for hypothesis, _, _ in rows), encoding="utf-8")
    (tmp_path / "ref.fr").write_text("".join(reference + "\n" for _, reference, _ in rows), encoding="utf-8")
    score_py.main([str(tmp_path / "out.fr"), "--reference", str(tmp_path / "ref.fr"), "--lang", "fr", "--json"])
    assert json.loads(capsys.readouterr().out) == score(*zip(*[row[:2] for row in rows]), lang="fr")
    rows, bleu = TABLE2_CASES["de"]
    hypotheses, references, _ = (list(column) for column in zip(*rows))
    (tmp_path / "out.de").write_text("".join(line + "\n" for line in hypotheses), encoding="utf-8")
    (tmp_path / "ref.de").write_text("".join(line + "\n" for line in references), encoding="utf-8")
    score_py.main([str(tmp_path / "out.de"), "--reference", str(tmp_path / "ref.de"), "--json"])
    found = json.loads(capsys.readouterr().out)
    assert found == score(hypotheses, references, lang="de") and round(found["bleu_tokenized"], 2) == bleu
    (tmp_path / "ref.de.gz").write_bytes(gzip.compress((tmp_path / "ref.de").read_bytes()))
    score_py.main([str(tmp_path / "out.de"), "--reference", str(tmp_path / "ref.de.gz")])
    assert capsys.readouterr().out.splitlines() == [
        f"sacreBLEU {found['bleu']:.1f}  chrF {found['chrf']:.1f}  tokenized BLEU {bleu:.1f}", found["bleu_signature"],
        found["bleu_tokenized_signature"]]
    (tmp_path / "short.de").write_text("".join(line + "\n" for line in references[:-1]), encoding="utf-8")
    (tmp_path / "cut.de.gz").write_bytes((tmp_path / "ref.de.gz").read_bytes()[:-10])  # a copy cut short
    (tmp_path / "empty.de").write_text("", encoding="utf-8")
    for files, said in (([tmp_path / "out.de", tmp_path / "short.de"], "has 8 lines and"),
                        ([tmp_path / "empty.de", tmp_path / "empty.de"], "has 0 lines and"),
                        ([tmp_path / "none.de", tmp_path / "ref.de"], "No such file or directory"),
                        ([tmp_path / "out.de", tmp_path / "cut.de.gz"], "cut.de.gz cannot be read")):
        with pytest.raises(SystemExit, match=said) as stopped:
            score_py.main([str(files[0]), "--reference", str(files[1])])
        assert str(stopped.value).startswith("error: ") and "\n" not in str(stopped.value)
