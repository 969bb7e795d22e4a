"""Merges that fold unlike memories together or change a fact the word check let through. Found
by an adversarial review of compaction:

- rows of two memory types (a procedural rule and a semantic fact of the same words) formed
  one group, and the merged record took the type ``semantic``: the rule stopped being one;
- a number written as a hyphenated compound word ("twenty-five") was read as no number at
  all, so "Is twenty-five years old" and "Is twenty-six years old" were no near miss and a
  merged text keeping one of them passed the check;
- a negation written as a prefix ("unable" / "able") was no near miss either;
- a unit of two letters ("km", "mg") was no content word, so a merged text swapping it for
  another ("mi", "g") in every member's statement passed the check.
"""

from __future__ import annotations

from tests.store import add, run, status
from tests.test_compaction import E0, groups_of, row

# ---------------------------------------------------------------------------------------------
# Memory types
# ---------------------------------------------------------------------------------------------


def test_rows_of_two_memory_types_are_not_one_group():
    rows = [
        row("Always answer in French", E0, memory_type="procedural"),
        row("Always answer in French", E0, memory_type="semantic"),
        row("Always answer in French.", E0, memory_type="procedural"),
    ]
    groups, _ = groups_of(rows)
    assert [sorted(m.memory_type for m in g) for g in groups] == [["procedural", "procedural"]]


def test_a_procedural_rule_is_not_merged_into_a_semantic_fact(engine, settings):
    rule = add(engine, "u1", "Always answer in French", memory_type="procedural", embedding=E0)
    fact = add(engine, "u1", "Always answer in French", memory_type="semantic", embedding=E0)
    report = run(engine, settings, jobs=["compaction"], llm=None)
    assert report["actions"] == []
    assert status(engine, rule) == status(engine, fact) == "active"
