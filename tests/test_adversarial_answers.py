"""Adversarial model answers the checks must catch, and the faithful answers beside them they
must not (an adversarial review of how merge texts and contradiction verdicts are validated;
each case failed before its fix). The model is faked at the HTTP boundary only.

- checking a long merged text took minutes (every new word compared with every source word).
"""

from __future__ import annotations

import time

from jobs.text_facts import unsupported_facts


class TestALongAnswerIsCheckedInLinearTime:
    def test_a_merged_text_of_200_kb_new_words_is_rejected_in_seconds(self):
        """Two 100 KB members (the hostile-input size) allow a 200 KB merged text; one made of
        words no member uses was compared word by word with every member word: 4 minutes."""

        def words(prefix: str, count: int) -> str:
            letters = "abcdefghijklmnopqrstuvwxyz"
            return " ".join(prefix + "".join(letters[i // 26**k % 26] for k in range(4))
                            for i in range(count))  # fmt: skip

        first, second = words("mem", 12_000), words("rec", 12_000)
        merged = words("new", 24_000)
        started = time.perf_counter()
        assert "added" in unsupported_facts(merged, [first, second])
        assert time.perf_counter() - started < 10
