"""Score a file of translations as training/run.py scores its test set: sacreBLEU and chrF with their signatures,
and BLEU as the paper's Table 2 scored it (Moses' tokens, compounds split: training/metrics/sacrebleu_chrf). For any
model vaswani-translate decodes, a converted one's too:

    vaswani-translate --model wmt16-en-de --input newstest2014.en --output newstest2014.out
    python training/score.py newstest2014.out --reference newstest2014.de --lang de
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for `training`

from training.evaluation import reported, score
from vaswani_hf.tools.text import read_lines, utf8_output


def main(argv: list[str] | None = None) -> None:
    utf8_output()
    parser = argparse.ArgumentParser(prog="training/score.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("translations", help="a file of translations, one a line")
    parser.add_argument("--reference", required=True, help="their references, line for line")
    parser.add_argument("--lang", default="de", help="their language, for Moses' tokenizer (default: de)")
    parser.add_argument("--json", action="store_true", help="the scores and their signatures as JSON")
    args = parser.parse_args(argv)
    try:
        translations, references = read_lines(args.translations), read_lines(args.reference)
    except (OSError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    if len(translations) != len(references) or not references:
        raise SystemExit(f"error: {args.translations} has {len(translations)} lines and {args.reference} "
                         f"{len(references)}: give a translation for each reference")
    scores = score(translations, references, lang=args.lang)
    print(json.dumps(scores, indent=1) if args.json else
          f"{reported(scores)}\n{scores['bleu_signature']}\n{scores['bleu_tokenized_signature']}")


if __name__ == "__main__":
    main()
