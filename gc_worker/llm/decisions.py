"""The four decisions the jobs ask of the model: request, answer schema and answer checks.

Each ``*_request`` builder returns a ``DecisionRequest``: what the model sees (ids and contents
in a data block), the cache inputs, the pydantic answer model sent as the strict JSON schema,
and a check that turns a schema-valid answer into a result or raises ``LLMInvalidAnswer``:

- merge (``MergeAnswer`` → ``MergeDecision``): ids must be in the group (``unknown_id``); a
  duplicate set must name exactly the whole group (``members_mismatch``); the merged text must
  not be empty (``empty_text``) nor longer than ``text_limit`` (``oversized``).
- contradiction (``ContradictionAnswer`` → ``ContradictionVerdict``): the answer must echo
  exactly the two ids in their roles (``unknown_id`` / ``ids_mismatch``).
- importance (``ImportanceAnswer`` → scores by input position): rejected whole on an index out
  of range, duplicated or missing, or a score outside 1..5.
- summary (``SummaryAnswer`` → text): the same empty / oversized checks as a merge.

Members are sorted by id before anything else, so the same group in another order is the same
decision (and the same cache entry).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from gc_worker.llm import prompts
from gc_worker.llm.errors import LLMInvalidAnswer

Member = tuple[Any, str]
MIN_TEXT_LIMIT = 2000
MIN_SCORE, MAX_SCORE = 1, 5
Verdict = Literal["contradicts", "duplicate", "compatible", "unsure"]

AnswerT = TypeVar("AnswerT", bound=BaseModel)
ResultT = TypeVar("ResultT")


class Answer(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True)


class MergeAnswer(Answer):
    is_duplicate_set: bool
    member_ids: list[str] | None = Field(None, description="every id of the group, if merged")
    merged_text: str | None = Field(None, description="the one merged statement, if merged")
    reason: str | None = Field(None, description="why not a duplicate set")


class ContradictionAnswer(Answer):
    older_id: str
    newer_id: str
    verdict: Verdict
    reason: str | None = None


class ImportanceScore(Answer):
    index: int = Field(description="0-based position of the memory in the given list")
    score: int = Field(description="1 (trivial) to 5 (core goal or identity)")


class ImportanceAnswer(Answer):
    scores: list[ImportanceScore]


class SummaryAnswer(Answer):
    summary: str


@dataclass(frozen=True)
class MergeDecision:
    """A validated merge answer: one merged statement for the whole group, or why not."""

    is_duplicate_set: bool
    merged_text: str | None
    reason: str | None
    member_ids: tuple[str, ...]


@dataclass(frozen=True)
class ContradictionVerdict:
    """A validated judgement on an (older, newer) pair."""

    verdict: Verdict
    reason: str
    older_id: str
    newer_id: str


@dataclass(frozen=True)
class DecisionRequest(Generic[AnswerT, ResultT]):
    """Everything the port needs to ask, cache and check one decision."""

    kind: str
    prompt_version: str
    system: str
    instruction: str
    payload: Any
    cache_inputs: Any
    memory_ids: tuple[str, ...]
    answer_model: type[AnswerT]
    check: Callable[[AnswerT], ResultT]


def normalise_members(members: Sequence[Member], *, minimum: int) -> list[tuple[str, str]]:
    """(id, content) pairs as strings, sorted by id; duplicate ids or too few are a caller bug."""
    pairs = sorted((str(memory_id), str(content)) for memory_id, content in members)
    if len({memory_id for memory_id, _ in pairs}) != len(pairs):
        raise ValueError("duplicate memory ids in one decision")
    if len(pairs) < minimum:
        raise ValueError(f"a decision needs at least {minimum} memories, got {len(pairs)}")
    return pairs


def text_limit(contents: Sequence[str]) -> int:
    """Longest acceptable merged or summary text: twice the longest member, at least 2000."""
    return max(2 * max((len(content) for content in contents), default=0), MIN_TEXT_LIMIT)


def check_text(text: str | None, limit: int) -> str:
    """The stripped text, or ``empty_text`` / ``oversized``."""
    stripped = (text or "").strip()
    if not stripped:
        raise LLMInvalidAnswer("empty_text")
    if len(stripped) > limit:
        raise LLMInvalidAnswer("oversized", f"{len(stripped)} chars, limit {limit}")
    return stripped


def check_merge(answer: MergeAnswer, member_ids: Sequence[str], limit: int) -> MergeDecision:
    """Accept a merge answer only if it stays inside the group and keeps a sane text."""
    group = set(member_ids)
    referenced = list(answer.member_ids or [])
    foreign = [memory_id for memory_id in referenced if memory_id not in group]
    if foreign:
        raise LLMInvalidAnswer("unknown_id", f"{len(foreign)} id(s) outside the group")
    if not answer.is_duplicate_set:
        return MergeDecision(False, None, (answer.reason or "").strip(), ())
    if len(referenced) != len(group) or set(referenced) != group:
        raise LLMInvalidAnswer("members_mismatch", "a merge must name every member once")
    return MergeDecision(True, check_text(answer.merged_text, limit), None, tuple(member_ids))


def check_contradiction(
    answer: ContradictionAnswer, older_id: str, newer_id: str
) -> ContradictionVerdict:
    """Accept a verdict only if it names exactly the two given ids in their roles."""
    if not {answer.older_id, answer.newer_id} <= {older_id, newer_id}:
        raise LLMInvalidAnswer("unknown_id", "answer names an id that was not given")
    if (answer.older_id, answer.newer_id) != (older_id, newer_id):
        raise LLMInvalidAnswer("ids_mismatch", "older_id / newer_id swapped or repeated")
    return ContradictionVerdict(answer.verdict, (answer.reason or "").strip(), older_id, newer_id)


def check_importance(answer: ImportanceAnswer, count: int) -> tuple[int, ...]:
    """Scores by input position; the whole answer is rejected on any bad entry."""
    indexes = [entry.index for entry in answer.scores]
    if any(not 0 <= index < count for index in indexes):
        raise LLMInvalidAnswer("index_out_of_range", f"indexes must be 0..{count - 1}")
    if len(set(indexes)) != len(indexes):
        raise LLMInvalidAnswer("duplicate_index")
    if len(indexes) != count:
        raise LLMInvalidAnswer("missing_index", f"{count - len(indexes)} missing")
    if any(not MIN_SCORE <= entry.score <= MAX_SCORE for entry in answer.scores):
        raise LLMInvalidAnswer("score_out_of_range", f"scores must be {MIN_SCORE}..{MAX_SCORE}")
    by_index = {entry.index: entry.score for entry in answer.scores}
    return tuple(by_index[index] for index in range(count))


def merge_request(members: Sequence[Member]) -> DecisionRequest[MergeAnswer, MergeDecision]:
    pairs = normalise_members(members, minimum=2)
    ids = [memory_id for memory_id, _ in pairs]
    limit = text_limit([content for _, content in pairs])
    return DecisionRequest(
        kind="merge",
        prompt_version=prompts.MERGE_VERSION,
        system=prompts.MERGE_SYSTEM,
        instruction="Is this group of memories one duplicate set?",
        payload=[{"id": memory_id, "content": content} for memory_id, content in pairs],
        cache_inputs=pairs,
        memory_ids=tuple(ids),
        answer_model=MergeAnswer,
        check=lambda answer: check_merge(answer, ids, limit),
    )


def contradiction_request(
    older: Member, newer: Member
) -> DecisionRequest[ContradictionAnswer, ContradictionVerdict]:
    (older_id, older_text), (newer_id, newer_text) = _as_pair(older), _as_pair(newer)
    if older_id == newer_id:
        raise ValueError("a contradiction needs two different memories")
    payload = {
        "older": {"id": older_id, "content": older_text},
        "newer": {"id": newer_id, "content": newer_text},
    }
    return DecisionRequest(
        kind="contradiction",
        prompt_version=prompts.CONTRADICTION_VERSION,
        system=prompts.CONTRADICTION_SYSTEM,
        instruction="Does the newer memory contradict the older one?",
        payload=payload,
        cache_inputs=payload,
        memory_ids=(older_id, newer_id),
        answer_model=ContradictionAnswer,
        check=lambda answer: check_contradiction(answer, older_id, newer_id),
    )


def importance_request(
    items: Sequence[Member],
) -> DecisionRequest[ImportanceAnswer, dict[str, int]]:
    pairs = normalise_members(items, minimum=1)
    ids = [memory_id for memory_id, _ in pairs]
    return DecisionRequest(
        kind="importance",
        prompt_version=prompts.IMPORTANCE_VERSION,
        system=prompts.IMPORTANCE_SYSTEM,
        instruction=f"Score each of these {len(pairs)} memories (indexes 0..{len(pairs) - 1}).",
        payload=[{"index": index, "content": content} for index, (_, content) in enumerate(pairs)],
        cache_inputs=pairs,
        memory_ids=tuple(ids),
        answer_model=ImportanceAnswer,
        check=lambda answer: dict(zip(ids, check_importance(answer, len(ids)), strict=True)),
    )


def summary_request(members: Sequence[Member]) -> DecisionRequest[SummaryAnswer, str]:
    pairs = normalise_members(members, minimum=1)
    limit = text_limit([content for _, content in pairs])
    return DecisionRequest(
        kind="summary",
        prompt_version=prompts.SUMMARY_VERSION,
        system=prompts.SUMMARY_SYSTEM,
        instruction="Fold these memories into one summary statement.",
        payload=[{"id": memory_id, "content": content} for memory_id, content in pairs],
        cache_inputs=pairs,
        memory_ids=tuple(memory_id for memory_id, _ in pairs),
        answer_model=SummaryAnswer,
        check=lambda answer: check_text(answer.summary, limit),
    )


def _as_pair(member: Member) -> tuple[str, str]:
    memory_id, content = member
    return str(memory_id), str(content)
