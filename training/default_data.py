"""The embedded default dataset: English-German sentence pairs from a small grammar written for this project.

    python training/default_data.py            # rewrites training/data/default/{train,validation,test}.jsonl

It is what `training/run.py` trains on when no data is named, so that the main job runs offline. The grammar
makes the model learn what translation needs beyond a word list: German gender and case on articles and
adjective endings (der große Hund / den großen Hund / mit dem großen Hund), plural forms, verb agreement, the
contraction "in dem" -> "im", and verb-second order after a fronted adverb ("today the dog sees ..." ->
"heute sieht der Hund ...").
"""

import json
import random
from pathlib import Path

OUTPUT = Path(__file__).resolve().parent / "data" / "default"
SIZES = {"train": 30000, "validation": 500, "test": 500}

# English singular, English plural: German singular, German plural, gender
NOUNS = {
    ("dog", "dogs"): ("Hund", "Hunde", "m"), ("man", "men"): ("Mann", "Männer", "m"),
    ("teacher", "teachers"): ("Lehrer", "Lehrer", "m"), ("car", "cars"): ("Wagen", "Wagen", "m"),
    ("friend", "friends"): ("Freund", "Freunde", "m"), ("bird", "birds"): ("Vogel", "Vögel", "m"),
    ("letter", "letters"): ("Brief", "Briefe", "m"), ("table", "tables"): ("Tisch", "Tische", "m"),
    ("cat", "cats"): ("Katze", "Katzen", "f"), ("woman", "women"): ("Frau", "Frauen", "f"),
    ("flower", "flowers"): ("Blume", "Blumen", "f"), ("door", "doors"): ("Tür", "Türen", "f"),
    ("city", "cities"): ("Stadt", "Städte", "f"), ("school", "schools"): ("Schule", "Schulen", "f"),
    ("child", "children"): ("Kind", "Kinder", "n"), ("house", "houses"): ("Haus", "Häuser", "n"),
    ("book", "books"): ("Buch", "Bücher", "n"), ("girl", "girls"): ("Mädchen", "Mädchen", "n"),
    ("horse", "horses"): ("Pferd", "Pferde", "n"), ("picture", "pictures"): ("Bild", "Bilder", "n"),
}
PLACES = {"garden": ("Garten", "m"), "park": ("Park", "m"), "city": ("Stadt", "f"), "school": ("Schule", "f"),
          "house": ("Haus", "n"), "village": ("Dorf", "n"), "kitchen": ("Küche", "f"), "forest": ("Wald", "m")}
ADJECTIVES = {"big": "groß", "small": "klein", "old": "alt", "new": "neu", "red": "rot", "young": "jung",
              "beautiful": "schön", "good": "gut", "white": "weiß", "black": "schwarz"}
# English 3rd singular, English plural: German 3rd singular, German plural (= 1st plural)
VERBS = {("sees", "see"): ("sieht", "sehen"), ("likes", "like"): ("mag", "mögen"),
         ("finds", "find"): ("findet", "finden"), ("has", "have"): ("hat", "haben"),
         ("buys", "buy"): ("kauft", "kaufen"), ("needs", "need"): ("braucht", "brauchen"),
         ("visits", "visit"): ("besucht", "besuchen"), ("draws", "draw"): ("zeichnet", "zeichnen"),
         ("knows", "know"): ("kennt", "kennen"), ("loves", "love"): ("liebt", "lieben")}
PRONOUNS = {"he": ("er", "sg"), "she": ("sie", "sg"), "it": ("es", "sg"), "we": ("wir", "pl"), "they": ("sie", "pl")}
ADVERBS = {"today": "heute", "now": "jetzt", "tomorrow": "morgen", "often": "oft", "again": "wieder"}

ARTICLES = {  # (determiner, case) -> German forms for m, f, n, plural
    ("the", "nom"): ("der", "die", "das", "die"), ("the", "acc"): ("den", "die", "das", "die"),
    ("the", "dat"): ("dem", "der", "dem", "den"),
    ("a", "nom"): ("ein", "eine", "ein", None), ("a", "acc"): ("einen", "eine", "ein", None),
    ("a", "dat"): ("einem", "einer", "einem", None),
    ("my", "nom"): ("mein", "meine", "mein", "meine"), ("my", "acc"): ("meinen", "meine", "mein", "meine"),
    ("my", "dat"): ("meinem", "meiner", "meinem", "meinen"),
}
WEAK = {"nom": ("e", "e", "e", "en"), "acc": ("en", "e", "e", "en"), "dat": ("en", "en", "en", "en")}
MIXED = {"nom": ("er", "e", "es", "en"), "acc": ("en", "e", "es", "en"), "dat": ("en", "en", "en", "en")}
SLOT = {"m": 0, "f": 1, "n": 2, "pl": 3}


def noun_phrase(rng: random.Random, case: str) -> tuple[str, str, str]:
    """(English, German, number) of a determiner, an optional adjective and a noun in the given case."""
    (english_sg, english_pl), (german_sg, german_pl, gender) = rng.choice(list(NOUNS.items()))
    determiner = rng.choice(["the", "a", "my"])
    plural = determiner != "a" and rng.random() < 0.3
    slot = SLOT["pl" if plural else gender]
    german_noun = german_pl if plural else german_sg
    if plural and case == "dat" and not german_noun.endswith(("n", "s")):
        german_noun += "n"  # dative plural: den Hunden, den Kindern
    english, german = [determiner], [ARTICLES[determiner, case][slot]]
    if rng.random() < 0.5:
        adjective = rng.choice(list(ADJECTIVES))
        endings = WEAK if determiner == "the" else MIXED
        english.append(adjective)
        german.append(ADJECTIVES[adjective] + endings[case][slot])
    english.append(english_pl if plural else english_sg)
    german.append(german_noun)
    if determiner == "a" and english[1][0] in "aeiou":
        english[0] = "an"  # an old dog
    return " ".join(english), " ".join(german), "pl" if plural else "sg"


def place_phrase(rng: random.Random) -> tuple[str, str]:
    place = rng.choice(list(PLACES))
    german_place, gender = PLACES[place]
    if rng.random() < 0.5:
        return f"in the {place}", f"im {german_place}" if gender in "mn" else f"in der {german_place}"
    english, german, _ = noun_phrase(rng, "dat")
    return f"with {english}", f"mit {german}"


def sentence_pair(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.25:
        subject_en, (subject_de, number) = rng.choice(list(PRONOUNS.items()))
    else:
        subject_en, subject_de, number = noun_phrase(rng, "nom")
    (verb_sg, verb_pl), (verbe_sg, verbe_pl) = rng.choice(list(VERBS.items()))
    verb_en, verb_de = (verb_sg, verbe_sg) if number == "sg" else (verb_pl, verbe_pl)
    object_en, object_de, _ = noun_phrase(rng, "acc")
    english = [subject_en, verb_en, object_en]
    german = [subject_de, verb_de, object_de]
    if rng.random() < 0.4:
        place_en, place_de = place_phrase(rng)
        english.append(place_en)
        german.append(place_de)
    if rng.random() < 0.3:  # a fronted adverb puts the German verb second: heute sieht der Hund ...
        adverb = rng.choice(list(ADVERBS))
        english.insert(0, adverb)
        german = [ADVERBS[adverb], german[1], german[0], *german[2:]]
    return capitalize(" ".join(english)) + ".", capitalize(" ".join(german)) + "."


def capitalize(text: str) -> str:
    return text[0].upper() + text[1:]


def generate(seed: int = 1706) -> dict[str, list[tuple[str, str]]]:
    """Disjoint splits: no English sentence appears in two of them."""
    rng = random.Random(seed)
    seen, splits = set(), {}
    for split, size in SIZES.items():
        pairs = []
        while len(pairs) < size:
            english, german = sentence_pair(rng)
            if english not in seen:
                seen.add(english)
                pairs.append((english, german))
        splits[split] = pairs
    return splits


def main():
    OUTPUT.mkdir(parents=True, exist_ok=True)
    for split, pairs in generate().items():
        with open(OUTPUT / f"{split}.jsonl", "w", encoding="utf-8") as file:
            file.writelines(json.dumps({"translation": {"en": english, "de": german}}, ensure_ascii=False) + "\n"
                            for english, german in pairs)
        print(f"{OUTPUT / split}.jsonl: {len(pairs)} pairs")


if __name__ == "__main__":
    main()
