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

from uuid import UUID

import pytest

from jobs.compaction import find_groups
from jobs.text_facts import near_miss_reasons, unsupported_facts
from tests.conftest import TEST_DIM
from tests.store import add, days_ago, get, run, status
from tests.test_compaction import E0, at_similarity, groups_of, row, unit
from tests.test_llm_guards import Model, merging_to

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


# ---------------------------------------------------------------------------------------------
# Numbers written as compound words
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b"), [
    ("Is twenty-five years old", "Is twenty-six years old"),
    ("Is twenty-five years old", "Is 26 years old"),
    ("Owes ninety-nine euros", "Owes ninety-one euros"),
])  # fmt: skip
def test_compound_number_words_that_differ_are_a_near_miss(a, b):
    assert "number" in near_miss_reasons(a, b)


@pytest.mark.parametrize(("a", "b"), [
    ("Is twenty-five years old", "Is 25 years old"),
    ("Is Twenty-Five years old", "Is twenty-five years old"),
    ("Owes ninety-nine euros", "Owes 99 euros"),
])  # fmt: skip
def test_compound_number_words_read_as_their_value(a, b):
    assert near_miss_reasons(a, b) == []


def test_a_merge_of_two_ages_in_words_is_not_asked(engine, settings, make_llm):
    a = add(engine, "u1", "Is twenty-five years old", created_at=days_ago(9), embedding=E0)
    b = add(engine, "u1", "Is twenty-six years old", created_at=days_ago(2),
            embedding=at_similarity(0.97))  # fmt: skip
    server = Model(merging_to("Is twenty-six years old"))
    report = run(engine, settings, jobs=["compaction"], llm=make_llm(server))
    assert server.chat_requests() == 0
    assert [(x["action"], x["reason"]) for x in report["actions"]] == [("deferred", "near_miss")]
    assert status(engine, a) == status(engine, b) == "active"


# ---------------------------------------------------------------------------------------------
# Negation by prefix
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b"), [
    ("Is unable to drive", "Is able to drive"),
    ("Is a non-smoker", "Is a smoker"),
    ("Finds the commute inconvenient", "Finds the commute convenient"),
])  # fmt: skip
def test_a_negating_prefix_is_a_near_miss(a, b):
    assert "negation" in near_miss_reasons(a, b)
    assert "negation" in near_miss_reasons(b, a)


def test_a_word_merely_starting_like_a_prefix_is_no_negation():
    assert near_miss_reasons("Invests in index funds", "Invests in index funds monthly") == []
    assert near_miss_reasons("Is unable to drive", "Is unable to drive at night") == []


def test_a_merge_of_able_and_unable_is_not_asked(engine, settings, make_llm):
    a = add(engine, "u1", "Is unable to drive", created_at=days_ago(9), embedding=E0)
    b = add(engine, "u1", "Is able to drive", created_at=days_ago(2),
            embedding=at_similarity(0.97))  # fmt: skip
    server = Model(merging_to("Is able to drive"))
    run(engine, settings, jobs=["compaction"], llm=make_llm(server))
    assert server.chat_requests() == 0
    assert status(engine, a) == status(engine, b) == "active"


# ---------------------------------------------------------------------------------------------
# Units of two letters
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "second", "merged"), [
    ("Runs 5 km every morning", "Runs 5 km each morning", "Runs 5 mi every morning"),
    ("Takes 10 mg of aspirin", "Takes 10 mg aspirin daily", "Takes 10 g of aspirin daily"),
])  # fmt: skip
def test_a_swapped_short_unit_is_caught(first, second, merged):
    assert {"added", "dropped"} & set(unsupported_facts(merged, [first, second]))


def test_a_merge_keeping_the_unit_passes():
    sources = ["Runs 5 km every morning", "Runs 5 km each morning"]
    assert unsupported_facts("Runs 5 km every morning", sources) == []


def test_a_merge_swapping_the_unit_is_not_applied(engine, settings, make_llm):
    a = add(engine, "u1", "Takes 10 mg of aspirin", created_at=days_ago(9), embedding=E0)
    b = add(engine, "u1", "Takes 10 mg aspirin daily", created_at=days_ago(2),
            embedding=at_similarity(0.97))  # fmt: skip
    server = Model(merging_to("Takes 10 g of aspirin daily"))
    report = run(engine, settings, jobs=["compaction"], llm=make_llm(server))
    assert server.chat_requests() == 1
    assert [x for x in report["actions"] if x["action"] == "create_merged"] == []
    assert status(engine, a) == status(engine, b) == "active"


# ---------------------------------------------------------------------------------------------
# Currency and percent signs, names split by punctuation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "second", "merged"), [
    ("Earns $50k a year", "Earns $50k per year", "Earns €50k a year"),
    ("Saves 10% of income", "Saves 10% of her income", "Saves 10 of income"),
    ("Sister is Mary Jane Watson", "Sister is Mary Jane Watson.", "Sister is Mary, Jane Watson"),
    ("Friends with John Paul Jones", "Is friends with John Paul Jones",
     "Is friends with John, Paul Jones"),
])  # fmt: skip
def test_a_merge_changing_a_sign_or_splitting_a_name_is_caught(first, second, merged):
    assert unsupported_facts(merged, [first, second]) != []


@pytest.mark.parametrize(("first", "second", "merged"), [
    ("Earns $50k a year", "Earns $50k per year", "Earns $50k a year"),
    ("Sister is Mary Jane Watson", "Sister is Mary Jane Watson.", "Sister is Mary Jane Watson"),
    ("Visited Paris, London", "Visited Paris and London", "Visited Paris, London"),
])  # fmt: skip
def test_a_merge_keeping_signs_and_names_passes(first, second, merged):
    assert unsupported_facts(merged, [first, second]) == []


def test_two_currencies_are_a_near_miss():
    assert "number" in near_miss_reasons("Earns $50k", "Earns €50k")
    assert near_miss_reasons("Earns $50k", "earns $50k") == []


def test_a_merge_into_another_currency_is_not_applied(engine, settings, make_llm):
    a = add(engine, "u1", "Earns $50k a year", created_at=days_ago(9), embedding=E0)
    b = add(engine, "u1", "Earns $50k per year", created_at=days_ago(2),
            embedding=at_similarity(0.97))  # fmt: skip
    server = Model(merging_to("Earns €50k a year"))
    report = run(engine, settings, jobs=["compaction"], llm=make_llm(server))
    assert server.chat_requests() == 1
    assert [x for x in report["actions"] if x["action"] == "create_merged"] == []
    assert status(engine, a) == status(engine, b) == "active"


# ---------------------------------------------------------------------------------------------
# A cached embedding of another size
# ---------------------------------------------------------------------------------------------


def test_a_cached_embedding_of_another_size_is_not_used(engine, settings, make_llm):
    """The embeddings cache is keyed on the model's name, not on the size it was asked for: a
    vector cached before ``[embeddings] dim`` changed was written into the merged record, and
    the store refused it — the batch failed, night after night."""
    import json

    import sqlalchemy as sa

    from gc_worker.llm import decision_key
    from jobs.compaction import EMBED_KIND, EMBED_VERSION

    text = "Has an allergy to peanuts and shellfish"
    llm = make_llm(Model(merging_to(text)))
    model = llm.options.embedding_model
    # the key as it was (no size in it), and as it is (a stale or damaged entry under it)
    for version in (EMBED_VERSION, f"{EMBED_VERSION}:{TEST_DIM}"):
        key = decision_key(EMBED_KIND, model, version, "u1", text)
        with engine.begin() as conn:
            conn.execute(
                sa.text("INSERT INTO gc_llm_cache (key, kind, user_id, memory_ids, value) "
                        "VALUES (:key, 'embedding', 'u1', '{}', CAST(:value AS jsonb))"),
                {"key": key, "value": json.dumps({"embedding": [0.5] * 3})},
            )  # fmt: skip
    a = add(engine, "u1", "Allergic to peanuts and shellfish", created_at=days_ago(9),
            embedding=E0)  # fmt: skip
    b = add(engine, "u1", "Has a peanut and shellfish allergy", created_at=days_ago(2),
            embedding=at_similarity(0.95))  # fmt: skip
    report = run(engine, settings, jobs=["compaction"], llm=llm)
    (created,) = [x for x in report["actions"] if x["action"] == "create_merged"]
    merged = get(engine, UUID(created["memory_id"]))
    assert merged["content"] == text and merged["metadata"]["embedding_source"] == "model"
    assert status(engine, a) == status(engine, b) == "merged"


# ---------------------------------------------------------------------------------------------
# The budget spent midway; a merged record merged again
# ---------------------------------------------------------------------------------------------


def _far(similarity_to_e2: float) -> list[float]:
    """A unit vector orthogonal to E0, at ``similarity_to_e2`` from e2 (towards e3)."""
    import math

    vector = [0.0] * TEST_DIM
    vector[2], vector[3] = similarity_to_e2, math.sqrt(1 - similarity_to_e2**2)
    return vector


def test_a_budget_spent_midway_merges_the_group_asked_and_defers_the_next(
    engine, settings, make_llm
):
    """One call left: the first group is merged (its embedding the members' centroid: no call
    is left for it), the second is deferred, and neither group is half-applied."""
    a = add(engine, "u1", "Allergic to peanuts and shellfish", embedding=E0,
            created_at=days_ago(9))  # fmt: skip
    b = add(engine, "u1", "Has a peanut and shellfish allergy", embedding=at_similarity(0.95),
            created_at=days_ago(2))  # fmt: skip
    c = add(engine, "u1", "Plays the oboe", embedding=_far(1.0))
    d = add(engine, "u1", "Plays an oboe in a band", embedding=_far(0.95))
    texts = {
        "oboe": "Plays an oboe in a band",
        "allergy": "Has an allergy to peanuts and shellfish",
    }

    def faithful(kind, payload):  # whichever group is asked first, a merge that may stand
        topic = "oboe" if "oboe" in payload[0]["content"] else "allergy"
        return merging_to(texts[topic])(kind, payload)

    server = Model(faithful)
    report = run(engine, settings, jobs=["compaction"],
                 llm=make_llm(server, max_calls_per_run=1))  # fmt: skip
    assert server.chat_requests() == 1 and len(server.requests) == 1
    by_action = report["totals"]["by_action"]
    assert by_action == {"create_merged": 1, "merge": 2, "deferred": 1}
    (deferral,) = [x for x in report["actions"] if x["action"] == "deferred"]
    assert deferral["reason"] == "llm_budget"
    (created,) = [x for x in report["actions"] if x["action"] == "create_merged"]
    content = get(engine, UUID(created["memory_id"]))["content"]
    merged = {str(a), str(b)} if "allergy" in content else {str(c), str(d)}
    assert {x["memory_id"] for x in report["actions"] if x["action"] == "merge"} == merged
    assert set(deferral["details"]["memory_ids"]) == {str(a), str(b), str(c), str(d)} - merged
    for memory in (a, b, c, d):
        assert status(engine, memory) == ("merged" if str(memory) in merged else "active")
    assert get(engine, UUID(created["memory_id"]))["metadata"]["embedding_source"] == "centroid"


def test_a_merged_record_is_merged_again_only_to_the_depth(engine, settings, make_llm):
    """max_merge_depth = 2: a merge (depth 1) takes in a new duplicate once (depth 2); the
    record of that second merge takes in none, night after night."""
    from datetime import timedelta

    from tests.store import NOW

    deep = settings.model_copy(update={"compaction": settings.compaction.model_copy(
        update={"max_merge_depth": 2})})  # fmt: skip
    texts = ["Plays the oboe", "Plays the oboe.", "plays the oboe", "Plays the oboe!"]
    depths = []
    for night, text in enumerate(texts):
        add(engine, "u1", text, embedding=E0, created_at=days_ago(10 - night))
        if night == 0:
            continue
        report = run(engine, deep, jobs=["compaction"], now=NOW + timedelta(days=night))
        created = [x for x in report["actions"] if x["action"] == "create_merged"]
        depths.append([get(engine, UUID(x["memory_id"]))["metadata"]["merge_depth"]
                       for x in created])  # fmt: skip
    assert depths == [[1], [2], []]


# ---------------------------------------------------------------------------------------------
# Negation by a word of frequency or of stopping
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b"), [
    ("Rarely drinks coffee", "Drinks coffee"),
    ("Seldom flies", "Flies"),
    ("Quit smoking", "Smokes"),
    ("Stopped eating meat", "Eats meat"),
    ("Is an ex-smoker", "Is a smoker"),
])  # fmt: skip
def test_a_negating_adverb_or_verb_is_a_near_miss(a, b):
    assert "negation" in near_miss_reasons(a, b)


@pytest.mark.parametrize(("first", "second", "merged"), [
    ("Rarely drinks coffee", "Seldom drinks coffee", "Drinks coffee"),
    ("Quit smoking in 2019", "Stopped smoking in 2019", "Smoking in 2019"),
])  # fmt: skip
def test_a_merge_dropping_a_negating_word_is_caught(first, second, merged):
    assert "negation" in unsupported_facts(merged, [first, second])


def test_a_merge_keeping_the_negating_word_passes():
    assert (
        unsupported_facts("Rarely drinks coffee", ["Rarely drinks coffee", "Seldom drinks coffee"])
        == []
    )


# ---------------------------------------------------------------------------------------------
# A merged record taking in a row unlike what it stands for
# ---------------------------------------------------------------------------------------------


def _longest(kind, payload):
    """A faithful merge: the longest member's text (it states all the others do)."""
    longest = max((m["content"] for m in payload), key=len)
    return merging_to(longest)(kind, payload)


def _angle(degrees: float) -> list[float]:
    import math

    return unit(math.radians(degrees))


def test_a_merged_record_takes_in_only_rows_like_every_row_it_stands_for(
    engine, settings, make_llm
):
    """A (0°) and B (31°) merge into a record whose embedding is their centroid (15.5°); C at
    47° reaches the record (0.85) but not A (0.68): taken in, the record would stand for rows
    that were never a duplicate set (a chain across nights). D at 20° reaches A and B too."""
    from datetime import timedelta

    from tests.store import NOW

    deep = settings.model_copy(update={"compaction": settings.compaction.model_copy(
        update={"max_merge_depth": 3})})  # fmt: skip
    llm = make_llm(Model(_longest), embedding_model="")  # no embeddings model: the centroid
    a = add(engine, "u1", "Plays the oboe", embedding=_angle(0), created_at=days_ago(9))
    b = add(engine, "u1", "Plays the oboe in a band", embedding=_angle(31),
            created_at=days_ago(8))  # fmt: skip
    run(engine, deep, jobs=["compaction"], llm=llm)
    assert status(engine, a) == status(engine, b) == "merged"
    c = add(engine, "u1", "Plays the oboe in a jazz band", embedding=_angle(47),
            created_at=days_ago(1))  # fmt: skip
    report = run(engine, deep, jobs=["compaction"], llm=llm, now=NOW + timedelta(days=1))
    assert report["actions"] == [] and status(engine, c) == "active"
    d = add(engine, "u1", "Plays the oboe in a brass band", embedding=_angle(20),
            created_at=days_ago(1))  # fmt: skip
    report = run(engine, deep, jobs=["compaction"], llm=llm, now=NOW + timedelta(days=2))
    assert report["totals"]["by_action"] == {"create_merged": 1, "merge": 2}
    assert status(engine, d) == "merged" and status(engine, c) == "active"


def test_find_groups_keeps_a_row_unlike_a_source_out_of_the_record_group():
    """Pure: the record (15.5°) stands for rows at 0° and 31°; a row at 47° reaches the record
    only, one at 20° reaches all three."""
    record = row("r", _angle(15.5), source="gc_merge", metadata={"merge_depth": 1})
    far, near = row("far", _angle(47)), row("near", _angle(20))
    ancestors = {record.id: [_angle(0), _angle(31)]}
    groups, _ = groups_of([record, far], max_merge_depth=3)
    assert len(groups) == 1  # without what the record stands for: one group
    groups, _ = find_groups([record, far], similarity=0.85, max_group_size=8, max_merge_depth=3,
                            dim=TEST_DIM, ancestors=ancestors)  # fmt: skip
    assert groups == []
    groups, _ = find_groups([record, near], similarity=0.85, max_group_size=8,
                            max_merge_depth=3, dim=TEST_DIM, ancestors=ancestors)  # fmt: skip
    assert [sorted(m.content for m in g) for g in groups] == [["near", "r"]]


def test_a_merge_folded_by_a_later_merge_is_restored_in_turn(engine, settings, make_llm):
    """max_merge_depth = 2: A + B → M1, then M1 + C → M2. Restoring M1 undoes its latest change
    (the fold into M2: M1 and C back, M2 off the read path); restoring A then undoes the first
    merge. No later run merges them again: each restore was a person's decision."""
    from datetime import timedelta

    from gc_worker import restore
    from tests.store import NOW

    deep = settings.model_copy(update={"compaction": settings.compaction.model_copy(
        update={"max_merge_depth": 2})})  # fmt: skip
    llm = make_llm(Model(_longest))
    a = add(engine, "u1", "Plays the oboe", embedding=E0, created_at=days_ago(9))
    b = add(engine, "u1", "Plays the oboe in a band", embedding=at_similarity(0.97),
            created_at=days_ago(8))  # fmt: skip
    first = run(engine, deep, jobs=["compaction"], llm=llm)
    (m1,) = [UUID(x["memory_id"]) for x in first["actions"] if x["action"] == "create_merged"]
    c = add(engine, "u1", "Plays the oboe in a jazz band", embedding=at_similarity(0.98),
            created_at=days_ago(1))  # fmt: skip
    second = run(engine, deep, jobs=["compaction"], llm=llm, now=NOW + timedelta(days=1))
    (m2,) = [UUID(x["memory_id"]) for x in second["actions"] if x["action"] == "create_merged"]
    assert status(engine, m1) == status(engine, c) == "merged"
    restore.restore_memory(engine, m1, now=NOW + timedelta(days=2))
    assert status(engine, m1) == status(engine, c) == "active" and status(engine, m2) != "active"
    restore.restore_memory(engine, a, now=NOW + timedelta(days=2))
    assert {status(engine, x) for x in (a, b, c)} == {"active"} and status(engine, m1) != "active"
    third = run(engine, deep, jobs=["compaction"], llm=llm, now=NOW + timedelta(days=3))
    assert [x for x in third["actions"] if x["action"] == "create_merged"] == []


# ---------------------------------------------------------------------------------------------
# Numbers moved to another thing; a bound turned around
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "second", "merged"), [
    ("Has 2 cats and 3 dogs", "Has two cats and three dogs", "Has 3 cats and 2 dogs"),
    ("Pays 20 euros for 3 books", "Pays 20 euros for three books", "Pays 3 euros for 20 books"),
    ("Works at Acme since 2019", "Has worked at Acme since 2019", "Worked at Acme until 2019"),
])  # fmt: skip
def test_a_merge_moving_a_number_or_turning_a_bound_is_caught(first, second, merged):
    assert unsupported_facts(merged, [first, second]) != []


@pytest.mark.parametrize(("first", "second", "merged"), [
    ("Has 2 cats and 3 dogs", "Has two cats and three dogs", "Has 3 dogs and 2 cats"),
    ("Wakes at 7 every day", "Wakes at 7 daily", "Wakes at 7 daily"),
    ("Works at Acme since 2019", "Has worked at Acme since 2019", "Has worked at Acme since 2019"),
])  # fmt: skip
def test_a_merge_reordering_counted_things_passes(first, second, merged):
    assert unsupported_facts(merged, [first, second]) == []


def test_offline_a_merged_record_takes_in_an_exact_duplicate_within_the_depth(engine, settings):
    """Offline the candidates are streamed inside the batch transaction; the rows a merged record
    stands for are read in between, on the same connection."""
    from datetime import timedelta

    from tests.store import NOW

    deep = settings.model_copy(update={"compaction": settings.compaction.model_copy(
        update={"max_merge_depth": 2})})  # fmt: skip
    for days in (9, 8):
        add(engine, "u1", "Plays the oboe", embedding=E0, created_at=days_ago(days))
    add(engine, "u2", "Plays the oboe", embedding=E0, created_at=days_ago(9))
    first = run(engine, deep, jobs=["compaction"], llm=None)
    assert first["totals"]["by_action"] == {"create_merged": 1, "merge": 2}
    late = add(engine, "u1", "Plays the oboe.", embedding=E0, created_at=days_ago(1))
    add(engine, "u2", "Plays the oboe.", embedding=E0, created_at=days_ago(1))
    second = run(engine, deep, jobs=["compaction"], llm=None, now=NOW + timedelta(days=1))
    assert second["totals"]["by_action"] == {"create_merged": 2, "merge": 4}
    assert status(engine, late) == "merged"


@pytest.mark.parametrize(("similarity", "joins"), [(0.851, True), (0.849, False)])
def test_a_row_at_the_threshold_of_a_records_source(similarity, joins):
    """Just inside and just outside `similarity` to one row the record stands for (the record
    itself and its other source are near): the row joins the record's group only inside."""
    import math

    record = row("r", _angle(8), source="gc_merge", metadata={"merge_depth": 1})
    edge = math.degrees(math.acos(similarity))  # from the source at 0°
    candidate = row("c", _angle(edge))
    ancestors = {record.id: [_angle(0), _angle(16)]}
    groups, _ = find_groups([record, candidate], similarity=0.85, max_group_size=8,
                            max_merge_depth=3, dim=TEST_DIM, ancestors=ancestors)  # fmt: skip
    assert (groups != []) is joins
