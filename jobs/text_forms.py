"""Forms of a fact that plain word comparison misses (pure functions, used by jobs.text_facts).

    prefix_negated(words_a, words_b)  one word set negates a word of the other by a prefix
                                      ("unable" / "able", "non-smoker" / "smoker").
    signs(text)                       the currency, percent and degree signs a text states, in
                                      order ("$50k" and "€50k" state two amounts).
    name_joins(text)                  pairs of adjacent capitalised words and whether only
                                      spaces stand between them ("Mary Jane" is one name,
                                      "Mary, Jane" two).
    split_or_joined(text, sources)    whether ``text`` splits a name its sources write as one, or
                                      joins names they keep apart.
    moved(counted, by_sources)        whether a text puts a number on a thing its sources count
                                      with another number ("2 cats and 3 dogs" → "3 cats").
    minus_before(text, start)         a minus sign right before the number at ``start`` ("-18").
    adds(text)                        whether a text presents its fact as one more ("Also …").
    hidden(text, sources)             whether a raw ``text`` uses a character no source uses that
                                      hides what it says from the word checks or from a reader
                                      (invisible, a digit's compatibility form, a strike-through).

Texts are expected prepared (NFKC) by the caller, but for ``hidden``, which reads them raw.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Iterable, Sequence

_NEGATING_PREFIXES = ("non-", "non", "ex-", "dis", "un", "in", "im", "il", "ir")
_OTHER_SIGNS = frozenset("%\u2030\u00b0")  # percent, per mille, degree
_WORD = re.compile(r"\w+(?:['.,:/-]\w+)*")
_MINUS = frozenset("-\u2212\u2013")  # hyphen-minus, the minus sign, an en dash
# A text that presents its fact as one more beside others ("Also speaks Spanish", "… on
# Thursdays as well"): the values it states are added, not replaced.
_ADDITIVE = re.compile(
    r"\b(?:also|additionally|as well|in addition)\b|\btoo\s*(?:[.,;:!?)]|$)", re.IGNORECASE
)


def prefix_negated(words_a: set[str], words_b: set[str]) -> bool:
    """A word of one set, absent from the other, is a negating prefix on a word of the other
    ("unable" / "able", "non-smoker" / "smoker", "ex-smoker" / "smoker", "inconvenient" /
    "convenient")."""
    for words, other in ((words_a - words_b, words_b), (words_b - words_a, words_a)):
        for word in words:
            for prefix in _NEGATING_PREFIXES:
                rest = word[len(prefix) :]
                if word.startswith(prefix) and len(rest) >= 3 and rest in other:
                    return True
    return False


def signs(text: str) -> list[str]:
    """Currency (Unicode category Sc), percent, per-mille and degree signs, in order."""
    return [c for c in text if c in _OTHER_SIGNS or unicodedata.category(c) == "Sc"]


def name_joins(text: str) -> set[tuple[str, str, bool]]:
    """(word, next word, joined) for each two adjacent capitalised words (no digit): joined when
    only spaces stand between them."""
    found = set()
    matches = list(_WORD.finditer(text))
    for left, right in itertools.pairwise(matches):
        a, b = left.group(), right.group()
        if not (_capitalised(a) and _capitalised(b)):
            continue
        gap = text[left.end() : right.start()]
        found.add((a.casefold(), b.casefold(), gap.isspace()))
    return found


def _capitalised(token: str) -> bool:
    return token[0].isupper() and not any(char.isdigit() for char in token)


def split_or_joined(text: str, sources: Sequence[str]) -> bool:
    """``text`` writes two adjacent names apart ("Mary, Jane") that no source writes so but one
    writes as one ("Mary Jane"), or the reverse."""
    mine = name_joins(text)
    theirs = _union(name_joins(source) for source in sources)
    return any(
        (a, b, not joined) in theirs and (a, b, joined) not in theirs for a, b, joined in mine
    )


def _union(sets: Iterable[set[tuple[str, str, bool]]]) -> set[tuple[str, str, bool]]:
    return set().union(*sets)


def moved(counted: set[tuple[str, str]], by_sources: set[tuple[str, str]]) -> bool:
    """A (number, thing) of the text that no source states, where a source counts that thing
    with another number: "Has 3 cats and 2 dogs" for "Has 2 cats and 3 dogs"."""
    return any(
        (number, thing) not in by_sources and any(other == thing for _, other in by_sources)
        for number, thing in counted
    )


def minus_before(text: str, start: int) -> bool:
    """A minus sign right before a number that starts at ``start``, not joining it to a word
    or number ("UTC-5", "5-10" are one token)."""
    if start == 0 or text[start - 1] not in _MINUS or not text[start].isdigit():
        return False
    return start == 1 or not text[start - 2].isalnum()


def adds(text: str) -> bool:
    """The text says its fact is one more ("also", "too", "as well", "in addition")."""
    return _ADDITIVE.search(text) is not None


# Characters the word checks do not read as a reader does: invisible ones (format: zero-width,
# bidi overrides, tag characters; controls, private use, unassigned) and digits' compatibility
# forms (superscripts, subscripts, circled digits, fractions), which NFKC turns into plain digits
# ("5⁰" reads "50" to the checks).
_HIDDEN_CATEGORIES = frozenset({"Cf", "Cc", "Co", "Cn", "Cs", "No"})
_LAYOUT = frozenset("\t\n\r")


def hidden(text: str, sources: Sequence[str]) -> bool:
    """``text`` (raw) uses a character no source uses that the checks read otherwise than a
    reader: an invisible or compatibility-digit one (``_HIDDEN_CATEGORIES``), or a combining
    mark on a plain letter or digit that composes with it into nothing ("n̶o̶t̶": struck out,
    yet no negation to the checks). A source's own characters are its words."""
    theirs = set().union(*(unicodedata.normalize("NFC", source) for source in sources))
    composed = unicodedata.normalize("NFC", text)
    for i, char in enumerate(composed):
        if char in theirs or char in _LAYOUT:
            continue
        category = unicodedata.category(char)
        if category in _HIDDEN_CATEGORIES:
            return True
        if category in ("Mn", "Me") and i > 0 and composed[i - 1].isascii():
            return True
    return False
