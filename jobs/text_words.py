"""Words of a text as jobs.text_facts compares them (pure functions): the text prepared, a token
as a word, a word's English Snowball stem, and the content words a merged text must keep.

    prepare(text)                 NFKC, invisible format characters dropped ("Par\u200bis" is
                                  "Paris"), curly apostrophes straightened, "7 pm" → "7pm"
    word(token)                   casefolded, a trailing "'s" dropped
    stem(word)                    English Snowball stem (one stemmer per thread)
    content_keys(text, negation)  the stems of its content words (not filler, not a negation,
                                  at least two letters or a unit after a number: "5 m"), or the
                                  characters of a script written without spaces
    negated_keys(text, negation)  the content keys a negation governs: from the negation to
                                  the clause's end ("Eats fish but not meat": "meat")
    negation_moved(text, sources, negation)   the text negates a word its sources use and
                                  none of them negates
    named_elsewhere(tokens, other)  the names it gives things ``other`` never mentions ("Rex"
                                  of "a dog named Rex" against "a cat named Tom")
    same_word(a, b) / uncovered(keys, by)   stems compared, one standing for a longer one it
                                  begins from five letters
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Callable, Sequence

import snowballstemmer

_STEMMERS = threading.local()  # a Snowball stemmer keeps state while it stems: one per thread
_CLOCK_SUFFIX = re.compile(r"(\d)\s*([ap])\.?m\b\.?", re.IGNORECASE)
# Format characters (Unicode Cf: zero-width, soft hyphen, joiners, bidi controls, tags) show
# nothing: a text holding one reads as the text without it. A merged text may not bring one in
# (text_forms.hidden reads the raw text); compared, they are gone.
_FORMAT = re.compile(
    "[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
    "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
    "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
    "\U000e0020-\U000e007f]"
)


def prepare(text: str) -> str:
    text = _FORMAT.sub("", unicodedata.normalize("NFKC", text))
    text = text.replace("\u2019", "'").replace("\u2018", "'")
    return _CLOCK_SUFFIX.sub(r"\1\2m", text)


def word(token: str) -> str:
    folded = token.casefold()
    return folded[:-2] if folded.endswith("'s") else folded


# Words that carry no fact of their own: a merge or summary may bring them in or leave them out.
_FILLER_WORDS = frozenset({
    "a", "an", "the", "and", "or", "but", "nor", "so", "yet", "of", "to", "in", "on", "at", "by",
    "for", "with", "from", "into", "onto", "about", "as", "than", "then", "that", "this", "these",
    "those", "there", "here", "which", "who", "whom", "whose", "what", "when", "where", "while",
    "since", "until", "till", "also", "too", "both", "either", "each", "other", "another", "such",
    "very", "really", "quite", "just", "still", "now", "currently", "usually", "generally",
    "often", "is", "are", "was", "were", "be", "been", "being", "am", "has", "have", "had",
    "having", "do", "does", "did", "doing", "it", "its", "itself", "they", "them", "their",
    "theirs", "themselves", "he", "him", "his", "she", "her", "hers", "we", "us", "our", "you",
    "your", "i", "me", "my", "mine", "myself", "one", "ones", "user", "users", "person",
    "someone", "somebody", "people", "summary", "summarised", "summarized", "various", "several",
    "including", "include", "includes",
})  # fmt: skip
_CONTENT_TOKEN = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")
# Scripts written without spaces between words (Chinese, Japanese, Thai, Lao, Khmer, Myanmar):
# a token is a whole clause there, so each of their characters is compared on its own.
_UNSPACED = re.compile(
    "[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
)
_SHARED_STEM = 5  # "allerg"/"allergi" (allergic/allergy) are one word; "astro…" two


def content_keys(text: str, negation: Callable[[str], bool]) -> set[str]:
    """The text's content words as comparison keys: casefolded and stemmed (English Snowball);
    each character of a script written without spaces. Words of two letters count (a unit:
    "km", "mg"), and a letter right after a number ("5 m", "5g": a unit too). Negations
    (``negation``), numbers and dates have checks of their own."""
    keys = set()
    prepared = prepare(text)
    for match in _CONTENT_TOKEN.finditer(prepared):
        token = match.group()
        if _UNSPACED.search(token):
            keys.update(char for char in token if char.isalpha())
            continue
        folded = word(token)
        if len(folded) < 2 and not _after_number(prepared, match.start()):
            continue
        if folded in _FILLER_WORDS or negation(folded):
            continue
        keys.add(stem(folded))
    return keys


def _after_number(text: str, start: int) -> bool:
    """Whether a digit (and at most one space) stands right before ``start``: a letter there is
    a unit ("5 m", "5g"), not a stray letter."""
    before = text[max(0, start - 2) : start]
    return before[-1:].isdigit() or (before[-1:] == " " and before[:1].isdigit())


# What ends a negation's reach: a clause's punctuation, or a word joining another clause ("or"
# does not: "does not eat meat or fish" negates both).
_CLAUSE_MARKS = frozenset(",;.:!?()[]\n")
_CLAUSE_WORDS = frozenset({"and", "but", "while", "whereas", "though", "although", "yet"})
_CLAUSED_TOKEN = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?|[,;.:!?()\[\]\n]")


def negated_keys(text: str, negation: Callable[[str], bool]) -> set[str]:
    """The content keys (as ``content_keys``) that follow a negation in its clause: "Eats fish
    but not meat" → {"meat"}, "Does not eat meat or fish" → {"eat", "meat", "fish"}."""
    keys: set[str] = set()
    negated = False
    for token in _CLAUSED_TOKEN.findall(prepare(text)):
        folded = word(token)
        if token in _CLAUSE_MARKS or folded in _CLAUSE_WORDS:
            negated = False
        elif negation(folded):
            negated = True
        elif negated and len(folded) >= 2 and folded not in _FILLER_WORDS:
            keys.add(stem(folded))
    return keys


def negation_moved(text: str, sources: Sequence[str], negation: Callable[[str], bool]) -> bool:
    """The text negates a word its sources use but none of them negates ("Eats meat but not
    fish" → "Eats fish but not meat"): the negation is there, on another fact."""
    negated = uncovered(
        negated_keys(text, negation), set().union(*(negated_keys(s, negation) for s in sources))
    )
    used = set().union(*(content_keys(s, negation) for s in sources))
    return bool(negated - uncovered(negated, used))


def same_word(a: str, b: str) -> bool:
    """One stem the other's prefix, the shorter at least ``_SHARED_STEM`` letters long (Snowball
    leaves "allergic" and "allergy" as "allerg" and "allergi"), or equal."""
    short, long = sorted((a, b), key=len)
    return a == b or (len(short) >= _SHARED_STEM and long.startswith(short))


def uncovered(keys: set[str], by: set[str]) -> set[str]:
    """The keys no key of ``by`` is the same word as. Only keys sharing their first
    ``_SHARED_STEM`` letters can be one word without being equal, so each key is compared with
    those only: comparing it with every key of ``by`` took 4 minutes for a 200 KB text of new
    words against two 100 KB sources."""
    by_prefix: dict[str, list[str]] = {}
    for b in by:
        by_prefix.setdefault(b[:_SHARED_STEM], []).append(b)
    return {
        k for k in keys
        if k not in by and not any(same_word(k, b) for b in by_prefix.get(k[:_SHARED_STEM], ()))
    }  # fmt: skip


def stem(text: str) -> str:
    stemmer = getattr(_STEMMERS, "english", None)
    if stemmer is None:
        stemmer = _STEMMERS.english = snowballstemmer.stemmer("english")
    return stemmer.stemWord(text)


_NAMING = frozenset({"named", "called"})


def named_elsewhere(tokens: Sequence[str], other: Sequence[str]) -> set[str]:
    """The names ``tokens`` give a thing the ``other`` words never mention ("Rex" of "Has a dog
    named Rex" against "Has a cat named Tom"): another thing's name, not a replaced one."""
    mentioned = {stem(word(token)) for token in other}
    return {
        word(name)
        for thing, verb, name in zip(tokens, tokens[1:], tokens[2:], strict=False)
        if word(verb) in _NAMING and stem(word(thing)) not in mentioned
    }
