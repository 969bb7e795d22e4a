"""What a text states — its numbers, dates, names, negations, directions, antonyms — and the
checks built on them (pure functions, no database, no LLM). How words are prepared, stemmed and
kept as content words is jobs.text_words; forms a word comparison misses (negating prefixes,
currency signs, a name split, a number moved to another thing, a minus sign, characters that
hide what a text says) are jobs.text_forms; the word lists (number and date words, negations,
antonyms …) are jobs.text_lexicon.

    near_miss_reasons(a, b)          reason codes (number, date, negation, name, direction,
                                     antonym) why two look-alike texts must NOT be merged or
                                     obsoleted offline; [] = safe to treat as duplicates. A
                                     negation is a word ("not", "never", "n't"), a prefix
                                     one text puts on a word of the other ("unable" / "able"),
                                     or one each puts on a word the other states ("Eats meat
                                     but not fish" / "Eats fish but not meat").
    unsupported_facts(text, sources) why a model's merge or summary cannot stand for its
                                     sources: a stated fact dropped or one invented — and,
                                     word by word, a content word none of them uses (added)
                                     or one every one of them uses missing (dropped); or a
                                     character none uses that hides what it says (hidden).
    differing_facts(a, b)            what could make two texts conflict (a replaced number, date
                                     or name, a negation, direction or antonym): a model's
                                     "contradicts" is acted on only then.

Near-miss policy ("Has 2 cats" vs "Has two cats"): number words zero..twenty, the tens and their
hyphenated compounds ("twenty-five") are read as their values, so those two texts give []; a
number we cannot read compares as text, and number
and date sequences compare in order, so the heuristic errs towards flagging: flagged members
are kept apart by compaction (the earliest consistent ones may still merge) and left to the
contradiction job.
Names: a capitalised word counts unless it opens a sentence AND is a common function word ("The",
"User", "It" ...), so "Alice is my sister" vs "Bob is my sister" is flagged; a name only differs
when its casefolded word is absent from the other text, so "User lives in Berlin." vs "user lives
in Berlin" gives [].
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from jobs import text_lexicon as lex
from jobs.text_forms import (
    adds,
    hidden,
    minus_before,
    moved,
    prefix_negated,
    signs,
    split_or_joined,
)
from jobs.text_words import content_keys, named_elsewhere, negation_moved
from jobs.text_words import prepare as _prepare
from jobs.text_words import stem as _stem
from jobs.text_words import uncovered as _uncovered
from jobs.text_words import word as _word

# ---------------------------------------------------------------------------------------------
# Near-miss guard
# ---------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"\w+(?:['.,:/-]\w+)*")
# A token opens a sentence when only these stand between it and the text's start or a stop.
_SENTENCE_STOPS = frozenset(".!?:;\n")
_SENTENCE_OPENERS = frozenset("\"'\u201c\u2018([*\u2022-")
_DATE_TOKEN = re.compile(
    r"(?:19|20)\d{2}(?:-\d{1,2}(?:-\d{1,2})?)?|\d{1,2}[/.-]\d{1,2}[/.-]\d{2,4}"
)
_DIGITS_COMMA = re.compile(r"(?<=\d),(?=\d{3}\b)")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(_prepare(text))


def _words(text: str) -> list[str]:
    return [_word(token) for token in _tokens(text)]


def _date_key(token: str) -> str | None:
    word = _word(token)
    if _DATE_TOKEN.fullmatch(word):
        return word
    if word in lex.CASE_SENSITIVE_MONTHS and not token[0].isupper():
        return None
    return lex.DATE_WORDS.get(word)


def _number_key(token: str) -> str | None:
    word = _DIGITS_COMMA.sub("", _word(token))
    if any(char.isdigit() for char in word):
        return word
    if "-" in word:
        return _compound_number(word.split("-"))
    return lex.NUMBER_WORDS.get(word)


def _compound_number(parts: list[str]) -> str | None:
    """ "twenty-five" → "25"; number words joined otherwise ("one-hundred") compare as text;
    None when a part is no number word ("well-known")."""
    values = [lex.NUMBER_WORDS.get(part) for part in parts]
    if None in values:
        return None
    tens, units = (int(v) for v in values[:2]) if len(values) == 2 else (0, 0)
    if tens in range(20, 100, 10) and units in range(1, 10):
        return str(tens + units)
    return "-".join(parts)


def _dates(text: str) -> list[str]:
    return [key for token in _tokens(text) if (key := _date_key(token)) is not None]


def _numbers(text: str) -> list[str]:
    """The numbers a text states, a minus sign with its number ("-18" is not "18"), then its
    currency, percent and degree signs ("$50k" and "€50k" state two amounts)."""
    prepared, keys = _prepare(text), []
    for match in _TOKEN.finditer(prepared):
        token = match.group()
        key = None if _date_key(token) else _number_key(token)
        if key is not None:
            keys.append("-" + key if minus_before(prepared, match.start()) else key)
    return keys + signs(prepared)


def _counted(text: str) -> set[tuple[str, str]]:
    """(number, stem of the word right after it): what each number counts ("2 cats")."""
    tokens, found = _tokens(text), set()
    for token, after in itertools.pairwise(tokens):
        key = None if _date_key(token) else _number_key(token)
        if key is not None and after.isalpha() and not _number_key(after):
            found.add((key, _stem(_word(after))))
    return found


def _is_negation(word: str) -> bool:
    return word in lex.NEGATIONS or word.endswith("n't")


def _negation_count(text: str) -> int:
    return sum(_is_negation(word) for word in _words(text))


def _is_name(token: str, sentence_initial: bool) -> bool:
    if not token[0].isupper() or any(char.isdigit() for char in token) or _date_key(token):
        return False
    word = _word(token)
    if _is_negation(word) or word == "i" or word.startswith("i'"):
        return False  # negations have their own check; "I" is not a name
    return not (sentence_initial and word in lex.SENTENCE_STARTERS)


def _names(text: str) -> set[str]:
    """Capitalised words, except digits/dates and function words opening a sentence."""
    prepared = _prepare(text)
    return {
        _word(match.group())
        for match in _TOKEN.finditer(prepared)
        if _is_name(match.group(), _sentence_initial(prepared, match.start()))
    }


def _sentence_initial(text: str, start: int) -> bool:
    """Whether ``text[start:]`` opens a sentence: scans back over openers only, so a long text
    costs linear time (a regex over the whole prefix per token was quadratic: 40 s at 100 KB)."""
    i = start
    while i > 0:
        char = text[i - 1]
        if char in _SENTENCE_STOPS:
            return True
        if not (char.isspace() or char in _SENTENCE_OPENERS):
            return False
        i -= 1
    return True


def _direction_labels(text: str) -> tuple[list[str], dict[str, frozenset[str]]]:
    """Directional markers (sorted), and for each content word the markers it follows."""
    markers: list[str] = []
    labels: dict[str, set[str]] = {}
    current = "^"
    for word in _words(text):
        if word in lex.DIRECTION_MARKERS:
            markers.append(word)
            current = word
        elif word in lex.DIRECTION_BOUNDARIES:
            current = "^"
        elif word not in lex.STOPWORDS:
            labels.setdefault(word, set()).add(current)
    return sorted(markers), {word: frozenset(found) for word, found in labels.items()}


def _direction_differs(text_a: str, text_b: str) -> bool:
    markers_a, labels_a = _direction_labels(text_a)
    markers_b, labels_b = _direction_labels(text_b)
    if not markers_a or markers_a != markers_b:
        return False
    shared = labels_a.keys() & labels_b.keys()
    return any(labels_a[word] != labels_b[word] for word in shared)


def _antonym_differs(text_a: str, text_b: str) -> bool:
    words_a, words_b = set(_words(text_a)), set(_words(text_b))
    for group in lex.ANTONYM_GROUPS:
        used_a = {i for i, family in enumerate(group) if family & words_a}
        used_b = {i for i, family in enumerate(group) if family & words_b}
        if used_a and used_b and used_a != used_b:
            return True
    return False


def _name_differs(text_a: str, text_b: str) -> bool:
    words_a, words_b = set(_words(text_a)), set(_words(text_b))
    return bool(_names(text_a) - words_b or _names(text_b) - words_a)


def near_miss_reasons(text_a: str, text_b: str) -> list[str]:
    """Reason codes why two look-alike texts differ in a fact that matters; [] = safe duplicates.

    Codes, always in this order: number, date, negation, name, direction, antonym.
    """
    checks = (
        ("number", _numbers(text_a) != _numbers(text_b)),
        ("date", _dates(text_a) != _dates(text_b)),
        (
            "negation",
            _negation_count(text_a) != _negation_count(text_b)
            or prefix_negated(set(_words(text_a)), set(_words(text_b)))
            # each negates what the other states: "Eats meat but not fish" / "… fish but not meat"
            or (_negation_moved(text_a, [text_b]) and _negation_moved(text_b, [text_a])),
        ),
        ("name", _name_differs(text_a, text_b)),
        ("direction", _direction_differs(text_a, text_b)),
        ("antonym", _antonym_differs(text_a, text_b)),
    )
    return [code for code, differs in checks if differs]


def unsupported_facts(text: str, sources: Sequence[str]) -> list[str]:
    """Reason codes why ``text`` (a model's merge of ``sources``) cannot stand for them: it
    adds or drops a number, a date or a name the sources state, says "not" where none of them
    does (or the reverse), reverses a direction one of them states ("from New York to
    Florida" → "from Florida to New York"), or uses the opposite of a word they use ("likes"
    → "dislikes", "morning" → "evening"); it uses a content word none of them uses ("Allergic
    to soy", an appended instruction: ``added``), or lacks one every one of them uses
    ("Allergic to peanuts" for two texts that also name shellfish: ``dropped``), or a
    character none of them uses that hides what it says (``hidden``: an invisible one, tag
    characters spelling an instruction, "5⁰" that reads "50" once NFKC-normalised). Words are
    compared by stem, so "allergy" stands for "allergic" (and character by character in
    scripts written without spaces); a synonym does not ("prefers" for
    "likes" is added): a merge is asked for in its members' own words, and one that is not is
    left unmerged. [] = every such fact is carried over, none invented or inverted."""
    source_words = set().union(*(_words(s) for s in sources))
    text_words = set(_words(text))
    stated_names = set().union(*(_inner_names(s) for s in sources))
    text_keys = content_keys(text, _is_negation)
    source_keys = [content_keys(s, _is_negation) for s in sources]
    shared_keys = set(source_keys[0]) if source_keys else set()
    for other in source_keys[1:]:  # the keys every source uses
        shared_keys -= _uncovered(shared_keys, other)
    checks = (
        (
            "number",
            set(_numbers(text)) != set().union(*(_numbers(s) for s in sources))
            or moved(_counted(text), set().union(*(_counted(s) for s in sources))),
        ),
        ("date", set(_dates(text)) != set().union(*(_dates(s) for s in sources))),
        (
            "negation",
            (_negation_count(text) > 0) != any(_negation_count(s) for s in sources)
            or _negation_moved(text, sources),
        ),
        (
            "name",
            bool(_inner_names(text) - source_words or stated_names - text_words)
            or split_or_joined(_prepare(text), [_prepare(s) for s in sources]),
        ),
        ("direction", any(_direction_reversed(text, s) for s in sources)),
        (
            "antonym",
            _antonym_added(text_words, source_words)
            or any(_antonym_swapped(text_words, set(_words(s))) for s in sources),
        ),
        ("added", bool(_uncovered(text_keys, set().union(*source_keys)))),
        ("dropped", bool(_uncovered(shared_keys, text_keys))),
        ("hidden", hidden(text, sources)),
    )
    return [code for code, differs in checks if differs]


def _negation_moved(text: str, sources: Sequence[str]) -> bool:
    return negation_moved(text, sources, _is_negation)


def _direction_reversed(text: str, source: str) -> bool:
    """A word the source places after a direction marker ("to Florida") appears in the text,
    but never after that marker ("from Florida"). Words the source places after none are not
    checked: the text may join other sources around them."""
    _, text_labels = _direction_labels(text)
    _, source_labels = _direction_labels(source)
    return any(
        word in text_labels and not (text_labels[word] & found)
        for word, found in source_labels.items()
        if found - {"^"}
    )


def _antonym_added(text_words: set[str], source_words: set[str]) -> bool:
    """The text uses a word of an antonym group the sources use, of a family none of them uses
    ("Likes spicy food" → "Likes mild food and dislikes spicy food")."""
    for group in lex.ANTONYM_GROUPS:
        used_text = {i for i, family in enumerate(group) if family & text_words}
        used_sources = {i for i, family in enumerate(group) if family & source_words}
        if used_sources and used_text - used_sources:
            return True
    return False


def _antonym_swapped(text_words: set[str], source_words: set[str]) -> bool:
    """The text uses a group of antonyms the source uses, but none of the source's words of
    it ("Likes spicy food" → "Dislikes spicy food"). A group the source does not use is not
    checked: a paraphrase may bring its own words ("Enjoys" for "Likes"), and a summary
    another source's ("morning" beside "evening")."""
    for group in lex.ANTONYM_GROUPS:
        used_text = {i for i, family in enumerate(group) if family & text_words}
        used_source = {i for i, family in enumerate(group) if family & source_words}
        if used_source and used_text and not used_text & used_source:
            return True
    return False


def unsupported_reason(text: str, sources: Sequence[str], what: str) -> str | None:
    """``unsupported_facts`` as a rejection reason for ``what`` ("merged text", "summary"), or
    None when the text may stand for its sources."""
    reasons = unsupported_facts(text, sources)
    return f"{what} {' and '.join(reasons)} not as its sources state it" if reasons else None


def differing_facts(text_a: str, text_b: str) -> list[str]:
    """What could make two texts state conflicting facts: a number, date or name (inside a
    sentence: its first word is as often a rephrased verb, "Likes" / "Enjoys") that one states
    and the other replaces — each has one the other lacks ("B1" / "B2"; not "a dog" / "2 cats",
    a detail added, nor "1 dog" / "2 cats" or "a dog named Rex" / "a cat named Tom", two
    things, nor when either text says it adds: "Also speaks Spanish", "too", "as well") —, a
    negation, direction or antonym. [] = nothing."""
    near = near_miss_reasons(text_a, text_b)
    inverted = [r for r in ("negation", "direction", "antonym") if r in near]
    if adds(_prepare(text_a)) or adds(_prepare(text_b)):
        return inverted  # "Also speaks Spanish": a value beside the other, not in its place
    reasons = []
    a = set(_numbers(text_a)) - _counting_elsewhere(text_a, text_b)
    b = set(_numbers(text_b)) - _counting_elsewhere(text_b, text_a)
    if a - b and b - a:
        reasons.append("number")
    a, b = set(_dates(text_a)), set(_dates(text_b))
    if a - b and b - a:
        reasons.append("date")
    tokens_a, tokens_b = _tokens(text_a), _tokens(text_b)
    names_a = _inner_names(text_a) - set(_words(text_b)) - named_elsewhere(tokens_a, tokens_b)
    names_b = _inner_names(text_b) - set(_words(text_a)) - named_elsewhere(tokens_b, tokens_a)
    if names_a and names_b:
        reasons.append("name")
    return reasons + inverted


def _counting_elsewhere(text: str, other: str) -> set[str]:
    """The numbers of ``text`` that count only things ``other`` never mentions ("1" of "Has 1
    dog" against "Has 2 cats"): another thing's count, not a replaced value."""
    things: dict[str, set[str]] = {}
    for number, thing in _counted(text):
        things.setdefault(number, set()).add(thing)
    mentioned = {_stem(word) for word in _words(other)}
    return {number for number, counted in things.items() if not counted & mentioned}


_ABBREVIATIONS = frozenset({"dr", "mr", "mrs", "ms", "prof", "st", "mt", "jr", "sr"})


def _inner_names(text: str) -> set[str]:
    """Capitalised words inside a sentence: a sentence's first word is as often a verb
    ("Likes green tea") as a name, and a merge may rephrase it. A colon or semicolon does not
    open a sentence here ("Manager: Alice"), nor a title's full stop ("Dr. Jones")."""
    prepared = _prepare(text)
    return {
        _word(match.group())
        for match in _TOKEN.finditer(prepared)
        if _is_name(match.group(), False) and not _opens_sentence(prepared, match.start())
    }


def _opens_sentence(text: str, start: int) -> bool:
    i = start
    while i > 0 and (text[i - 1].isspace() or text[i - 1] in _SENTENCE_OPENERS):
        i -= 1
    if i == 0:
        return True
    if text[i - 1] not in ".!?\n":
        return False
    before = _TOKEN.findall(text[max(0, i - 12) : i - 1])
    return not (text[i - 1] == "." and before and before[-1].casefold() in _ABBREVIATIONS)
