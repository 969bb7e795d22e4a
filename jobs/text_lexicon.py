"""The word lists jobs.text_facts reads texts with (data only): number words, date words,
negations, direction markers, sentence starters and antonym groups."""

from __future__ import annotations

UNIT_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen", "twenty",
)  # fmt: skip
TENS_WORDS = ("thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
NUMBER_WORDS = (
    {word: str(value) for value, word in enumerate(UNIT_WORDS)}
    | {word: str(10 * tens) for tens, word in enumerate(TENS_WORDS, start=3)}
    | {"hundred": "100", "thousand": "1000", "million": "1000000"}
)

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
MONTHS = (
    "january", "february", "march", "april", "may", "june", "july", "august", "september",
    "october", "november", "december",
)  # fmt: skip
DATE_WORDS = (
    {day: day for day in WEEKDAYS}
    | {day + "s": day for day in WEEKDAYS}
    | {"tue": "tuesday", "tues": "tuesday", "thu": "thursday", "thurs": "thursday"}
    | {"fri": "friday", "today": "today", "tomorrow": "tomorrow", "yesterday": "yesterday"}
    | {"tonight": "tonight", "weekend": "weekend", "weekends": "weekend"}
    | {month: month for month in MONTHS}
    | {month[:3]: month for month in MONTHS if month not in ("may", "march")}
    | {"sept": "september"}
)
CASE_SENSITIVE_MONTHS = {"may", "march"}  # modal verb / verb unless capitalised

NEGATIONS = {
    "not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot",
    "dont", "doesnt", "didnt", "isnt", "arent", "wasnt", "werent", "cant", "couldnt",
    "shouldnt", "wouldnt", "havent", "hasnt", "hadnt",
    # a frequency that all but denies, a habit given up: "Rarely drinks coffee" / "Quit smoking"
    # are not "Drinks coffee" / "Smokes"
    "rarely", "seldom", "hardly", "barely", "scarcely", "formerly", "quit", "quits", "stopped",
}  # fmt: skip

DIRECTION_MARKERS = {
    "from", "to", "into", "onto", "toward", "towards", "than", "before", "after", "over",
    "above", "below", "under", "since", "until", "till",
}  # fmt: skip
DIRECTION_BOUNDARIES = {"and", "or", "but", "in", "on", "at", "with", "for", "by", "because"}
STOPWORDS = {"the", "a", "an", "of", "is", "are", "be", "was", "were"}
# A capital on these opening a sentence is grammar, not a name ("The user ..." vs "User ...").
SENTENCE_STARTERS = {
    "the", "a", "an", "this", "that", "these", "those", "there", "here", "it", "its", "he",
    "she", "they", "we", "you", "i", "my", "his", "her", "their", "our", "your", "user", "users",
    "in", "on", "at", "for", "from", "to", "with", "by", "and", "or", "but", "if", "when",
    "every", "each", "all", "some", "always", "also", "has", "have", "had", "is", "was", "are",
    "does", "do", "did", "can", "will", "would", "should", "must",
}  # fmt: skip

ANTONYM_GROUPS: tuple[tuple[frozenset[str], ...], ...] = tuple(
    tuple(frozenset(family.split()) for family in group)
    for group in (
        ("like likes liked liking", "dislike dislikes disliked disliking"),
        ("love loves loved loving", "hate hates hated hating"),
        ("prefer prefers preferred preferring", "avoid avoids avoided avoiding"),
        ("morning mornings", "afternoon afternoons", "evening evenings", "night nights"),
        ("enable enables enabled", "disable disables disabled"),
        ("early earlier", "late later"),
    )
)
