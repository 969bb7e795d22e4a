"""Tests for jobs.similarity: text normalisation, the near-miss guard, cosine grouping."""

from __future__ import annotations

import hashlib
import itertools
import time

import numpy as np
import pytest

from jobs import similarity
from jobs.similarity import (
    complete_linkage_groups,
    content_hash,
    cosine_matrix,
    invalid_vector_rows,
    normalise_text,
    pairs_above,
)
from jobs.text_facts import differing_facts, near_miss_reasons, unsupported_facts

THRESHOLD = 0.85


def at_angle(*cosines: float) -> np.ndarray:
    """Unit vectors in the plane, the k-th at angle arccos(cosines[k]) from the x axis."""
    angles = np.arccos(np.asarray(cosines, dtype=np.float64))
    return np.column_stack([np.cos(angles), np.sin(angles)])


def pair_with_cosine(cosine: float) -> np.ndarray:
    """Two unit vectors whose cosine is exactly `cosine` (the first is the x axis)."""
    return np.array([[1.0, 0.0], [cosine, np.sqrt(1.0 - cosine * cosine)]])


def path(*step_cosines: float) -> np.ndarray:
    """Unit vectors in the plane, each turned from the previous by a step of the given cosine."""
    angles = np.concatenate([[0.0], np.cumsum(np.arccos(step_cosines))])
    return np.column_stack([np.cos(angles), np.sin(angles)])


def chain(step_cosine: float, length: int) -> np.ndarray:
    """Unit vectors in the plane, each one step (of the given cosine) from the previous."""
    return path(*[step_cosine] * (length - 1))


def groups(ids: list[str], vectors: np.ndarray, *, cap: int = 8) -> list[list[str]]:
    """complete_linkage_groups at the module threshold."""
    return complete_linkage_groups(ids, vectors, similarity=THRESHOLD, max_group_size=cap)


def clustered(seed: int, n_centres: int, copies: int, dim: int = 64) -> np.ndarray:
    """Noisy copies around random centres, shuffled."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_centres, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    rows = np.repeat(centres, copies, axis=0) + rng.normal(
        scale=0.06, size=(n_centres * copies, dim)
    )
    return rows[rng.permutation(len(rows))]


class TestNormaliseText:
    def test_casefold_whitespace_and_edge_punctuation(self) -> None:
        """Case, runs of whitespace and surrounding punctuation do not matter."""
        assert normalise_text("  User   lives\tin\nBerlin. ") == "user lives in berlin"

    def test_nfkc_and_casefold(self) -> None:
        """Compatibility forms and German sharp s normalise to their plain forms."""
        assert normalise_text("\uff33traße \ufb01le") == normalise_text("STRASSE file")

    def test_inner_punctuation_kept(self) -> None:
        """Punctuation inside the text is content and stays."""
        assert normalise_text('"Version 2.1, not 2.0!"') == "version 2.1, not 2.0"

    def test_only_punctuation_is_empty(self) -> None:
        """A text of punctuation and spaces normalises to the empty string."""
        assert normalise_text(" ...!? ") == ""


class TestContentHash:
    def test_is_sha256_of_user_nul_normalised_text(self) -> None:
        """The hash is sha256 hex over user_id, a NUL byte and the normalised text."""
        expected = hashlib.sha256(b"u1\0user lives in berlin").hexdigest()
        assert content_hash("u1", "User lives in Berlin.") == expected

    def test_equal_for_normalised_duplicates(self) -> None:
        """Texts that normalise alike hash alike for the same user."""
        assert content_hash("u1", "Likes TEA!") == content_hash("u1", "likes tea")

    def test_differs_between_users(self) -> None:
        """The same text for two users never shares a hash."""
        assert content_hash("u1", "likes tea") != content_hash("u2", "likes tea")

    def test_nul_separator_prevents_ambiguity(self) -> None:
        """Moving characters between user id and text changes the hash."""
        assert content_hash("ab", "c") != content_hash("a", "bc")


class TestNearMissReasons:
    @pytest.mark.parametrize(
        ("text_a", "text_b", "reason"),
        [
            ("English level is B1", "English level is B2", "number"),
            ("Meeting at 3pm", "Meeting at 4 p.m.", "number"),
            ("Uses Python 3.11", "Uses Python 3.12", "number"),
            ("Has 2 cats", "Has 3 cats", "number"),
            ("Born in 1990", "Born in 1991", "date"),
            ("Dentist on 2024-05-01", "Dentist on 2024-05-02", "date"),
            ("Call on Monday", "Call on Tuesday", "date"),
            ("Trip in May", "Trip in June", "date"),
            ("prefers morning meetings", "does not prefer morning meetings", "negation"),
            ("likes coffee", "doesn't like coffee", "negation"),
            ("travels with luggage", "travels without luggage", "negation"),
            ("Meeting with Alice on Monday", "Meeting with Bob on Monday", "name"),
            ("Alice is my sister", "Bob is my sister", "name"),
            ("Dr. Smith is the dentist", "Dr. Jones is the dentist", "name"),
            ("flights from New York to Florida", "flights from Florida to New York", "direction"),
            ("Alice reports to Bob", "Bob reports to Alice", "direction"),
            ("prefers tea over coffee", "prefers coffee over tea", "direction"),
            ("likes tea", "dislikes tea", "antonym"),
            ("prefers morning meetings", "prefers evening meetings", "antonym"),
        ],
    )
    def test_flags_fact_that_differs(self, text_a: str, text_b: str, reason: str) -> None:
        """Look-alike texts that differ in a fact carry the matching reason, both ways round."""
        assert reason in near_miss_reasons(text_a, text_b)
        assert reason in near_miss_reasons(text_b, text_a)

    @pytest.mark.parametrize(
        ("text_a", "text_b"),
        [
            ("User lives in Berlin.", "user lives in Berlin"),
            ("Has 2 cats", "Has two cats"),
            ("User prefers dark mode", "The user prefers dark mode"),
            ("Alice is the user's manager", "The user's manager is Alice"),
            ("Meeting at 3 PM", "meeting at 3pm"),
            ("Salary is 1,000 EUR", "Salary is 1000 EUR"),
            ("Has no cats", "Doesn't have cats"),
            ("Works remotely on Fridays", "Works remotely on Friday"),
            ("Moved to Paris in 2020", "In 2020, moved to Paris"),
            ("User wants to learn Spanish", "User is learning Spanish"),
            ("It may rain on the trip", "It might rain on the trip"),
            ("I like green tea", "User likes green tea"),
        ],
    )
    def test_paraphrase_is_safe(self, text_a: str, text_b: str) -> None:
        """Paraphrases without a differing fact give no reason."""
        assert near_miss_reasons(text_a, text_b) == []

    def test_number_words_read_as_values(self) -> None:
        """'two' equals '2' (documented choice) but not '3'."""
        assert near_miss_reasons("Has 2 cats", "Has two cats") == []
        assert near_miss_reasons("Has 3 cats", "Has two cats") == ["number"]

    def test_numbers_compare_in_order(self) -> None:
        """Swapping two quantities is a difference, not a paraphrase."""
        assert "number" in near_miss_reasons("2 cats and 3 dogs", "3 cats and 2 dogs")

    def test_lowercase_may_is_not_a_month(self) -> None:
        """The modal verb 'may' is not read as the month May."""
        assert near_miss_reasons("It may rain", "It could rain") == []

    def test_reasons_in_canonical_order(self) -> None:
        """Several differences are reported once each, in the documented order."""
        reasons = near_miss_reasons("Alice flies to Rome on Monday", "Bob never flies on Friday")
        assert reasons == ["date", "negation", "name"]

    def test_identical_texts(self) -> None:
        """A text compared with itself is always safe."""
        text = "Flights from New York to Florida on 2024-05-01 at 3pm, not with Bob"
        assert near_miss_reasons(text, text) == []


class TestInvalidVectorRows:
    def test_reports_nan_inf_and_zero_rows(self) -> None:
        """Rows with NaN, infinity or zero norm are reported by position."""
        vectors = np.array([[1.0, 0.0], [np.nan, 1.0], [0.0, 0.0], [np.inf, 0.0], [0.0, 2.0]])
        assert invalid_vector_rows(vectors) == [1, 2, 3]

    def test_empty_input(self) -> None:
        """No rows means nothing invalid, for an empty array and an empty list alike."""
        assert invalid_vector_rows(np.empty((0, 1536))) == []
        assert invalid_vector_rows([]) == []

    def test_rejects_non_matrix(self) -> None:
        """A 1-D vector is a usage error, not one row."""
        with pytest.raises(ValueError, match="2-D"):
            invalid_vector_rows(np.ones(3))


class TestCosineMatrix:
    def test_known_angles(self) -> None:
        """Entries equal the cosine of the angle between rows, whatever their length."""
        vectors = at_angle(1.0, 0.5, -0.5) * np.array([[1.0], [3.0], [0.2]])
        expected = np.array([[1.0, 0.5, -0.5], [0.5, 1.0, 0.5], [-0.5, 0.5, 1.0]])
        np.testing.assert_allclose(cosine_matrix(vectors), expected, atol=1e-12)

    def test_symmetric_and_clipped(self) -> None:
        """The matrix is exactly symmetric and never leaves [-1, 1]."""
        rng = np.random.default_rng(1)
        sims = cosine_matrix(np.vstack([rng.normal(size=(50, 1536))] * 2))
        assert np.array_equal(sims, sims.T)
        assert sims.max() <= 1.0 and sims.min() >= -1.0

    def test_invalid_rows_are_nan(self) -> None:
        """Invalid rows and their columns are NaN, the rest is untouched."""
        sims = cosine_matrix(np.array([[1.0, 0.0], [0.0, 0.0], [np.nan, 1.0], [1.0, 0.0]]))
        assert np.isnan(sims[1]).all() and np.isnan(sims[:, 2]).all()
        assert sims[0, 3] == pytest.approx(1.0)

    def test_empty(self) -> None:
        """Zero rows give a 0x0 matrix."""
        assert cosine_matrix(np.empty((0, 4))).shape == (0, 0)


class TestCompleteLinkageGroups:
    @pytest.mark.parametrize("n", [0, 1])
    def test_fewer_than_two_vectors(self, n: int) -> None:
        """Zero or one memory never forms a group."""
        assert groups([f"m{i}" for i in range(n)], np.ones((n, 8))) == []

    def test_just_inside_threshold(self) -> None:
        """A pair one millionth above the threshold is grouped."""
        assert groups(["a", "b"], pair_with_cosine(THRESHOLD + 1e-6)) == [["a", "b"]]

    def test_just_outside_threshold(self) -> None:
        """A pair one millionth below the threshold is not grouped."""
        assert groups(["a", "b"], pair_with_cosine(THRESHOLD - 1e-6)) == []

    @pytest.mark.parametrize("cosine", [THRESHOLD, np.nextafter(THRESHOLD, 0.0)])
    def test_exactly_at_threshold_counts_as_within(self, cosine: float) -> None:
        """A pair at the threshold, even one float ulp under it after rounding, is grouped."""
        assert groups(["a", "b"], pair_with_cosine(cosine)) == [["a", "b"]]

    def test_no_chaining(self) -> None:
        """A~B and B~C but A!~C never yields {A, B, C}; exactly one pair is grouped."""
        result = groups(["a", "b", "c"], chain(0.9, 3))
        assert len(result) == 1 and len(result[0]) == 2
        assert result[0] != ["a", "c"]

    def test_long_chain_only_adjacent_pairs(self) -> None:
        """Along a chain every group holds only members all within the threshold."""
        ids = [f"m{i:02d}" for i in range(12)]
        result = groups(ids, chain(0.95, 12))
        index = {memory_id: k for k, memory_id in enumerate(ids)}
        for group in result:
            span = index[group[-1]] - index[group[0]]
            assert np.cos(span * np.arccos(0.95)) >= THRESHOLD

    def test_all_pairs_property_on_random_clusters(self) -> None:
        """In every group of noisy clustered data, every pair reaches the threshold."""
        vectors = clustered(seed=3, n_centres=15, copies=6)
        ids = [f"m{i:03d}" for i in range(len(vectors))]
        sims, position = cosine_matrix(vectors), {memory_id: i for i, memory_id in enumerate(ids)}
        result = groups(ids, vectors)
        assert result
        for group in result:
            for a, b in itertools.combinations(group, 2):
                assert sims[position[a], position[b]] >= THRESHOLD - 1e-9

    def test_max_group_size_splits_without_dropping(self) -> None:
        """Ten near-identical memories with a cap of 4 become groups of 4, 4 and 2."""
        ids = [f"m{i}" for i in range(10)]
        result = groups(ids, np.tile([1.0, 0.0, 0.0], (10, 1)), cap=4)
        assert sorted(len(group) for group in result) == [2, 4, 4]
        assert sorted(itertools.chain.from_iterable(result)) == ids

    def test_cap_groups_most_similar_together(self) -> None:
        """Splitting an oversized cluster keeps the tightest members together."""
        vectors = at_angle(1.0, 0.9999, 0.9998, 0.97, 0.96)
        result = groups(["a", "b", "c", "d", "e"], vectors, cap=3)
        assert ["a", "b", "c"] in result

    def test_post_check_splits_a_chained_cluster(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """If the clusterer ever returned a chained cluster, the post-check splits it."""

        def one_cluster(sims: np.ndarray, _similarity: float) -> np.ndarray:
            return np.zeros(len(sims), dtype=int)

        monkeypatch.setattr(similarity, "_cluster_labels", one_cluster)
        result = groups(["a", "b", "c", "d"], path(0.95, 0.9, 0.99))
        assert result == [["a", "b"], ["c", "d"]]

    def test_invalid_vectors_skipped(self) -> None:
        """NaN and zero vectors never join a group, even next to exact duplicates."""
        vectors = np.array([[1.0, 0.0], [1.0, 0.0], [np.nan, 0.0], [0.0, 0.0], [1.0, 0.001]])
        assert groups(["a", "b", "c", "d", "e"], vectors) == [["a", "b", "e"]]

    def test_a_large_cluster_is_carved_in_bounded_time(self) -> None:
        """3,000 near-copies (a bulk import) are carved into capped groups in seconds, not the
        cubic minutes of re-reading the whole cluster for every group."""
        rng = np.random.default_rng(0)
        vectors = np.tile([1.0, 0.0, 0.0, 0.0], (3000, 1)) + rng.normal(scale=1e-3, size=(3000, 4))
        ids = [f"m{i:05d}" for i in range(3000)]
        started = time.perf_counter()
        result = groups(ids, vectors)
        assert time.perf_counter() - started < 10
        assert sorted(len(group) for group in result) == [8] * 375

    def test_deterministic_and_input_order_independent(self) -> None:
        """Shuffled input gives the same groups, members sorted, groups by smallest id."""
        vectors = clustered(seed=5, n_centres=10, copies=5)
        ids = [f"m{i:03d}" for i in range(len(vectors))]
        expected = groups(ids, vectors)
        order = np.random.default_rng(9).permutation(len(ids))
        shuffled = groups([ids[i] for i in order], vectors[order])
        assert shuffled == expected == groups(ids, vectors)
        assert all(group == sorted(group) for group in expected)
        assert [group[0] for group in expected] == sorted(group[0] for group in expected)

    def test_high_dimensional_user(self) -> None:
        """500 x 1536 vectors cluster into the planted duplicate groups."""
        rng = np.random.default_rng(7)
        centres = rng.normal(size=(50, 1536))
        vectors = np.repeat(centres, 2, axis=0) + rng.normal(scale=0.01, size=(100, 1536))
        vectors = np.vstack([vectors, rng.normal(size=(400, 1536))])
        result = groups([f"m{i:03d}" for i in range(500)], vectors)
        assert result == [[f"m{2 * k:03d}", f"m{2 * k + 1:03d}"] for k in range(50)]

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"similarity": 1.5, "max_group_size": 8}, "similarity"),
            ({"similarity": 0.85, "max_group_size": 1}, "max_group_size"),
        ],
    )
    def test_rejects_bad_parameters(self, kwargs: dict[str, float], message: str) -> None:
        """Out-of-range similarity or a cap under 2 is a usage error."""
        with pytest.raises(ValueError, match=message):
            complete_linkage_groups(["a", "b"], np.eye(2), **kwargs)  # type: ignore[arg-type]

    def test_rejects_mismatched_or_duplicate_ids(self) -> None:
        """Ids must be unique and match the vectors one to one."""
        with pytest.raises(ValueError, match="ids for"):
            groups(["a"], np.eye(2))
        with pytest.raises(ValueError, match="unique"):
            groups(["a", "a"], np.eye(2))


class TestPairsAbove:
    def test_threshold_boundaries(self) -> None:
        """Pairs just inside and at the threshold are listed; just outside is not."""
        inside, outside = pair_with_cosine(THRESHOLD + 1e-6), pair_with_cosine(THRESHOLD - 1e-6)
        vectors = np.block([[inside, np.zeros((2, 2))], [np.zeros((2, 2)), outside]])
        result = pairs_above(["a", "b", "c", "d"], vectors, similarity=THRESHOLD)
        assert [(a, b) for a, b, _ in result] == [("a", "b")]
        assert result[0][2] == pytest.approx(THRESHOLD + 1e-6, abs=1e-12)

    def test_chaining_pairs_all_listed(self) -> None:
        """Pairs are independent: A~B and B~C are both candidates, A~C is not."""
        result = pairs_above(["a", "b", "c"], chain(0.9, 3), similarity=THRESHOLD)
        assert sorted((a, b) for a, b, _ in result) == [("a", "b"), ("b", "c")]

    def test_order_most_similar_first_then_ids(self) -> None:
        """Output is sorted by descending similarity, ties by ids, smaller id first."""
        vectors = at_angle(1.0, 1.0, 0.9)
        result = pairs_above(["z", "y", "x"], vectors, similarity=0.8)
        assert [(a, b) for a, b, _ in result] == [("y", "z"), ("x", "y"), ("x", "z")]
        assert all(isinstance(sim, float) for _, _, sim in result)

    def test_skips_invalid_and_handles_empty(self) -> None:
        """Invalid rows never pair; no vectors give no pairs."""
        vectors = np.array([[1.0, 0.0], [np.nan, 0.0], [0.0, 0.0]])
        assert pairs_above(["a", "b", "c"], vectors, similarity=0.0) == []
        assert pairs_above([], np.empty((0, 3)), similarity=0.5) == []


class TestFactChecks:
    """unsupported_facts (a merge or summary against its sources) and differing_facts (a
    contradiction verdict against the pair's texts)."""

    @pytest.mark.parametrize(
        ("text", "sources", "expected"),
        [
            ("Likes green tea", ["Likes green tea", "Enjoys drinking green tea"], []),
            ("Allergic to peanuts and shellfish",
             ["Allergic to peanuts", "Allergic to peanuts and shellfish"], []),
            ("Not allergic to anything; works at Acme since 2019",
             ["Allergic to peanuts", "Allergic to peanuts and shellfish"],
             ["date", "negation", "name", "added", "dropped"]),
            ("User has preferences.", ["Owes Bob 500 EUR", "Does not eat pork"],
             ["number", "negation", "name", "added"]),
            ("Manager: Bob", ["Manager: Alice", "manager: Alice"], ["name", "added", "dropped"]),
            ("Dentist is Dr. Jones", ["Dentist is Dr. Smith"], ["name", "added", "dropped"]),
            ("Travels to Lisbon for work", ["Travels to Lisbon for work", "Often travels"], []),
            ("Books flights from Florida to New York",
             ["Books flights from New York to Florida"], ["direction"]),
            ("Books flights from New York to Florida",
             ["Usually books flights from New York to Florida"], []),
            ("Prefers evening meetings", ["Prefers morning meetings"],
             ["antonym", "added", "dropped"]),
            ("Dislikes spicy food", ["Likes spicy food", "Really likes spicy food"],
             ["antonym", "added", "dropped"]),
            ("Avoids coffee", ["Prefers coffee"], ["antonym", "added", "dropped"]),
            # not an antonym group the source uses, but words it never says ("drinking")
            ("Enjoys drinking green tea", ["Likes green tea"], ["added", "dropped"]),
            ("Likes tea and dislikes coffee", ["Likes tea", "Dislikes coffee"], []),
            # a review found these faithful summaries rejected by the first version
            ("User moved from Boston to Denver. User works remotely as a designer.",
             ["User moved from Boston to Denver", "User works remotely as a designer"], []),
            ("Has family in London and flies to London monthly",
             ["Has family in London", "Flies to London monthly"], []),
            ("Goes running every morning and walks the dog in the evening",
             ["Goes running every morning", "Walks the dog in the evening"], []),
            # an inversion that also repeats the source's word (a later review)
            ("Likes mild food and dislikes spicy food",
             ["Likes spicy food", "Really likes spicy food"], ["antonym", "added"]),
            ("Prefers evening meetings over morning meetings",
             ["Prefers morning meetings", "Really prefers morning meetings"], ["antonym", "added"]),
        ],
    )  # fmt: skip
    def test_unsupported_facts(self, text: str, sources: list[str], expected: list[str]):
        """Facts added or dropped by the new text are named; a faithful merge passes."""
        assert unsupported_facts(text, sources) == expected

    @pytest.mark.parametrize(
        ("a", "b", "expected"),
        [
            ("English level is B1", "English level is B2", ["number"]),
            ("Lives in Paris", "Lives in Berlin", ["name"]),
            ("Manager: Alice", "Manager: Bob", ["name"]),
            ("Likes green tea", "Enjoys drinking green tea", []),
            ("Has a dog", "Has a cat", []),
            ("Has a dog", "Has 2 cats", []),
            ("Prefers morning meetings", "Does not prefer morning meetings", ["negation"]),
        ],
    )
    def test_differing_facts(self, a: str, b: str, expected: list[str]):
        """Only a replaced number, date or name, or a negation, direction or antonym counts."""
        assert differing_facts(a, b) == expected
