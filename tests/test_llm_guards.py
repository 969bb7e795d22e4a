"""Model answers and outages the LLM jobs must survive without acting wrongly (cases a review
reproduced; each failed before its fix). The model is faked at the HTTP boundary only
(MockTransport under the real openai client, the real port, budget and Postgres decision
cache)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from uuid import UUID

import httpx2
import pytest

from gc_worker.config import Settings
from tests.conftest import TEST_DIM
from tests.store import add, days_ago, get, run, status
from tests.test_compaction import E0, at_similarity, unit
from tests.test_llm_port import chat_reply, data_block, embeddings_reply, error_reply


class Model:
    """An OpenAI-compatible server: ``answer(kind, payload)`` → the JSON answer (dict), or an
    httpx2.Response to send as is; embeddings from a fixed vector. Records every request."""

    def __init__(self, answer: Callable[[str, Any], Any]) -> None:
        self.answer = answer
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        body = json.loads(request.content)
        if request.url.path.endswith("/embeddings"):
            return embeddings_reply([unit(0.05) for _ in body["input"]])
        kind = body["response_format"]["json_schema"]["name"]
        reply = self.answer(kind, data_block(body["messages"][1]["content"]))
        return reply if isinstance(reply, httpx2.Response) else chat_reply(reply)

    def chat_requests(self) -> int:
        return sum(r.url.path.endswith("/chat/completions") for r in self.requests)


# ---------------------------------------------------------------------------------------------
# Shared answers
# ---------------------------------------------------------------------------------------------


def merging_to(text: str) -> Callable[[str, Any], Any]:
    def answer(kind: str, payload: Any) -> Any:
        assert kind == "MergeAnswer"
        return {"is_duplicate_set": True, "member_ids": [m["id"] for m in payload],
                "merged_text": text, "reason": None}  # fmt: skip

    return answer


# ---------------------------------------------------------------------------------------------
# 2. A non-finite embedding from the model fails the whole batch
# ---------------------------------------------------------------------------------------------


def nan_embeddings(request: httpx2.Request) -> httpx2.Response:
    """An embeddings answer with a NaN in every vector (JSON `NaN`, which Python's json — and
    so the openai client — reads as a float); a buggy or hostile server can send it."""
    texts = json.loads(request.content)["input"]
    vector = "[" + ",".join(["NaN"] + ["0.5"] * (TEST_DIM - 1)) + "]"
    data = ",".join(
        f'{{"object":"embedding","index":{i},"embedding":{vector}}}' for i in range(len(texts))
    )
    body = (f'{{"object":"list","data":[{data}],"model":"m",'
            f'"usage":{{"prompt_tokens":1,"total_tokens":1}}}}')  # fmt: skip
    return httpx2.Response(200, content=body.encode(), headers={"content-type": "application/json"})


class NaNEmbeddingModel(Model):
    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith("/embeddings"):
            self.requests.append(request)
            return nan_embeddings(request)
        return super().__call__(request)


class TestABadEmbeddingIsABadAnswer:
    def test_compaction_falls_back_to_the_centroid_instead_of_failing_the_batch(
        self, engine, settings, make_llm
    ):
        """docs/reliability.md: an LLM "answering garbage" leaves the run complete, errors
        counted; docs/llm-jobs.md: if the embeddings call fails the merged record gets the
        members' centroid. A NaN in the embeddings answer passes `_checked_vectors` (count and
        size only), is written to gc_llm_cache (jsonb refuses `NaN`) / the vector column
        (pgvector refuses NaN): the whole batch — every user and job in it — fails, night
        after night while the server answers so. Here a TTL expiry of another user in the
        same batch is lost with it."""
        batch_stands_with_the_centroid(engine, settings, make_llm, NaNEmbeddingModel,
                                       "one NaN embedding")  # fmt: skip


def batch_stands_with_the_centroid(engine, settings, make_llm, model: type, what: str) -> None:
    """u1's two paraphrases merge while the embeddings endpoint answers with ``model``'s bad
    answer, and u2's TTL expiry in the same batch: the merged record takes its members'
    centroid, the expiry is applied (the batch was not failed for ``what``)."""
    from gc_worker.errors import RunFailed

    add(engine, "u1", "Likes green tea", created_at=days_ago(9), embedding=E0)
    add(engine, "u1", "Enjoys drinking green tea", created_at=days_ago(2),
        embedding=at_similarity(0.95))  # fmt: skip
    expired = add(engine, "u2", "Temporary note", expires_at=days_ago(1))
    server = model(merging_to("Enjoys drinking green tea"))
    try:
        report = run(engine, settings, jobs=["ttl_expiry", "compaction"],
                     llm=make_llm(server))  # fmt: skip
    except RunFailed as exc:
        pytest.fail(f"{what} failed the batch: {exc}")
    assert status(engine, expired) == "deleted"
    [created] = [x for x in report["actions"] if x["action"] == "create_merged"]
    assert get(engine, UUID(created["memory_id"]))["metadata"]["embedding_source"] == "centroid"

    def test_user_cap_summary_falls_back_to_the_centroid(self, engine, make_llm):
        """The same in summarize mode: the summary's NaN embedding fails the batch at insert."""
        from gc_worker.errors import RunFailed

        settings = Settings.model_validate(
            {"embeddings": {"dim": TEST_DIM},
             "user_cap": {"max_memories": 2, "overflow": "summarize"}}
        )  # fmt: skip
        for i, text in enumerate(["Plays the piano", "Likes jazz", "Core goal: sail"]):
            add(engine, "u1", text, importance=1 + 4 * (i == 2), created_at=days_ago(30 - i),
                embedding=unit(0.1 * i))  # fmt: skip
        server = NaNEmbeddingModel(lambda kind, p: {"summary": "Plays the piano, likes jazz"})
        try:
            report = run(engine, settings, jobs=["user_cap"], llm=make_llm(server))
        except RunFailed as exc:
            pytest.fail(f"one NaN embedding failed the batch: {exc}")
        [created] = [x for x in report["actions"] if x["action"] == "create_merged"]
        assert get(engine, UUID(created["memory_id"]))["metadata"]["embedding_source"] == "centroid"


# ---------------------------------------------------------------------------------------------
# 3. An expired row (TTL passed, not yet soft-deleted) wins a contradiction
# ---------------------------------------------------------------------------------------------


def contradicts(kind: str, payload: Any) -> Any:
    assert kind == "ContradictionAnswer"
    return {"older_id": payload["older"]["id"], "newer_id": payload["newer"]["id"],
            "verdict": "contradicts", "reason": "moved"}  # fmt: skip


class TestAnExpiredRowNeverWins:
    @pytest.mark.parametrize("basis", ["similar", "slot"])
    def test_contradiction_does_not_retire_a_fact_for_an_expired_one(
        self, engine, settings, make_llm, basis
    ):
        """A memory whose `expires_at` has passed is no longer current (the `active_memories`
        view and the read rule drop it) — it only waits for ttl_expiry. contradiction's
        candidates do not exclude it (compaction's do: `expires_at > :now`), so in a run
        without ttl_expiry before it (`run --job contradiction`, `[ttl_expiry] enabled =
        false`) it obsoletes the older, still-current fact: the read path then returns
        neither of them."""
        from gc_worker.read_rule import current_memories
        from tests.store import NOW

        slot = {"slot": "profile.city"} if basis == "slot" else {}
        older = add(engine, "u1", "Lives in Berlin", created_at=days_ago(300), embedding=E0,
                    **slot)  # fmt: skip
        newer = add(engine, "u1", "Lives in Paris", created_at=days_ago(20),
                    expires_at=days_ago(1), embedding=at_similarity(0.9), **slot)  # fmt: skip
        report = run(engine, settings, jobs=["contradiction"], llm=make_llm(Model(contradicts)))
        obsoleted = [a["memory_id"] for a in report["actions"] if a["action"] == "obsolete"]
        with engine.connect() as conn:
            current = [str(m["id"]) for m in current_memories(conn, "u1", None, NOW)]
        assert obsoleted == [], (
            f"{basis}: the current fact was obsoleted by a row that expired a day ago; "
            f"current memories now: {current}"
        )
        assert status(engine, older) == "active" and str(newer) not in current


# ---------------------------------------------------------------------------------------------
# 5. user_cap (summarize) keeps asking a model that is down, user after user
# ---------------------------------------------------------------------------------------------


class TestUserCapStopsAskingAModelThatIsDown:
    def test_after_an_outage_the_rest_of_the_batch_is_deferred_without_a_request(
        self, engine, make_llm
    ):
        """Every other LLM job stops asking for the rest of the batch once the server did not
        answer after its retries (importance, contradiction, compaction: "no retry storm
        against a server that is down"; docs/reliability.md: "LLM down | at most 1 +
        max_retries requests per question, then the rest of the batch deferred"). user_cap in
        summarize mode asks again — with the full retry/backoff sequence (up to 30 s a wait) —
        for every over-cap user of the batch (500 by default)."""
        settings = Settings.model_validate(
            {"embeddings": {"dim": TEST_DIM},
             "user_cap": {"max_memories": 1, "overflow": "summarize"}}
        )  # fmt: skip
        users = ["u1", "u2", "u3", "u4"]
        for user in users:
            for i in range(3):
                add(engine, user, f"{user} memory {'abc'[i]}", created_at=days_ago(10 - i))
        server = Model(lambda kind, payload: error_reply(503))
        report = run(engine, settings, jobs=["user_cap"], llm=make_llm(server, max_retries=1))
        deferred = [a for a in report["actions"] if a["action"] == "deferred"]
        assert sorted(a["user_id"] for a in deferred) == users
        assert all(a["reason"] == "llm_unavailable" for a in deferred)
        assert server.chat_requests() <= 2, (
            f"{server.chat_requests()} requests to a server that is down "
            f"({len(users)} over-cap users x (1 + max_retries))"
        )


# ---------------------------------------------------------------------------------------------
# 1. A merged text (or summary) that flips a direction or an antonym passes the fact check
# ---------------------------------------------------------------------------------------------


class TestMergedTextMayNotInvertAFact:
    @pytest.mark.parametrize(
        ("first", "second", "inverted"),
        [
            pytest.param("Books flights from New York to Florida",
                         "Usually books flights from New York to Florida",
                         "Books flights from Florida to New York", id="direction"),
            pytest.param("Prefers morning meetings", "Really prefers morning meetings",
                         "Prefers evening meetings", id="antonym-time"),
            pytest.param("Likes spicy food", "Really likes spicy food",
                         "Dislikes spicy food", id="antonym-verb"),
        ],
    )  # fmt: skip
    def test_compaction_rejects_a_merge_that_inverts_the_members(
        self, engine, settings, make_llm, first, second, inverted
    ):
        """Members agree; the model's merged text states the opposite (a flipped direction or
        an antonym — exactly the near misses compaction never merges between members). Such an
        answer must be rejected (docs/llm-jobs.md: "a wrong ... model answer changes
        nothing"); today it passes `unsupported_facts` (which checks only numbers, dates,
        names and negations), the members are retired as `merged` and the store's one current
        statement of the fact is its opposite."""
        a = add(engine, "u1", first, created_at=days_ago(9), embedding=E0)
        b = add(engine, "u1", second, created_at=days_ago(2), embedding=at_similarity(0.95))
        server = Model(merging_to(inverted))
        report = run(engine, settings, jobs=["compaction"], llm=make_llm(server))
        assert server.chat_requests() == 1  # the model was asked (not a near miss, not exact)
        created = [x for x in report["actions"] if x["action"] == "create_merged"]
        merged_texts = [get(engine, UUID(c["memory_id"]))["content"] for c in created]
        assert merged_texts == [], f"members merged into their opposite: {merged_texts}"
        assert status(engine, a) == status(engine, b) == "active"
        assert report["jobs"]["compaction"]["errors"] == 1

    def test_user_cap_rejects_a_summary_that_inverts_the_folded_rows(self, engine, make_llm):
        """The same gap in summarize mode: the summary is all that stays of the folded rows once
        they are purged, yet a summary stating their opposite is accepted."""
        settings = Settings.model_validate(
            {"embeddings": {"dim": TEST_DIM},
             "user_cap": {"max_memories": 2, "overflow": "summarize"}}
        )  # fmt: skip
        folded = [
            add(engine, "u1", "Prefers morning meetings", importance=1, created_at=days_ago(30)),
            add(engine, "u1", "Likes spicy food", importance=1, created_at=days_ago(29)),
        ]
        add(engine, "u1", "Core goal: learn to sail", importance=5, created_at=days_ago(1))

        def answer(kind: str, payload: Any) -> Any:
            assert kind == "SummaryAnswer"
            return {"summary": "Prefers evening meetings and dislikes spicy food"}

        server = Model(answer)
        report = run(engine, settings, jobs=["user_cap"], llm=make_llm(server))
        assert server.chat_requests() == 1
        summaries = [x for x in report["actions"] if x["action"] == "create_merged"]
        texts = [get(engine, UUID(s["memory_id"]))["content"] for s in summaries]
        assert texts == [], f"rows folded into their opposite: {texts}"
        assert [status(engine, m) for m in folded] == ["active", "active"]


# ---------------------------------------------------------------------------------------------
# 4. A resumed run gets a fresh model budget: llm.max_calls_per_run is not the run's
# ---------------------------------------------------------------------------------------------


def scores_all(kind: str, payload: Any) -> Any:
    assert kind == "ImportanceAnswer"
    return {"scores": [{"index": item["index"], "score": 4} for item in payload]}


class TestTheBudgetIsTheRuns:
    def test_a_resumed_run_does_not_get_a_second_budget(self, engine, make_llm):
        """`llm.max_calls_per_run = 1`, two one-user batches that each need one call. The run
        is stopped after its first batch (SIGTERM / a deploy: the run stays `running`,
        resumable) and then completed — by the same process and port here; a restarted daemon
        resumes nightly runs the same way. `process_run` calls `llm.begin_run()` on every entry,
        so the resumed part gets a fresh budget and the run spends 2 calls: the limit is per
        process entry, not per run (a crash-looping worker spends a whole budget per restart,
        on the same run)."""
        from gc_worker import engine as gc_engine
        from gc_worker.report import build_report
        from tests.store import NOW

        settings = Settings.model_validate(
            {"embeddings": {"dim": TEST_DIM}, "run": {"batch_users": 1, "workers": 1},
             "llm": {"max_calls_per_run": 1}}
        )  # fmt: skip
        for user in ("u1", "u2"):
            add(engine, user, f"{user} plays the piano")
        server = Model(scores_all)
        llm = make_llm(server, max_calls_per_run=settings.llm.max_calls_per_run)
        request = gc_engine.RunRequest(mode="apply", now=NOW, jobs=("importance",))
        run_id = gc_engine.start_run(engine, settings, request)
        done = [0]

        def one_batch(n: int) -> None:
            done[0] += n

        completed = gc_engine.process_run(
            engine, run_id, settings, llm=llm, on_batch=one_batch, should_stop=lambda: done[0] >= 1
        )
        assert completed is False and done[0] == 1 and server.chat_requests() == 1
        assert gc_engine.process_run(engine, run_id, settings, llm=llm) is True
        with engine.connect() as conn:
            report = build_report(conn, run_id)
        assert server.chat_requests() <= 1, (
            f"the run made {server.chat_requests()} model calls with max_calls_per_run = 1 "
            f"(report llm.calls = {report['llm']['calls']})"
        )
        assert report["totals"]["by_action"].get("deferred") == 1


class TestAnAbsurdUsageFigure:
    @pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic's, on the float Infinity
    @pytest.mark.parametrize("tokens", [2**63, float("inf")], ids=["2**63", "Infinity"])
    def test_is_bounded_and_the_answer_used(self, engine, make_llm, tokens):
        """A server (or a proxy) reporting `prompt_tokens` past bigint, or `Infinity`: the run's
        shared spend overflowed (NumericValueOutOfRange) or the usage could not be read
        (OverflowError), and the paid-for answer was lost and the batch failed. A figure is
        taken as at most USAGE_CEILING tokens. Found by a review."""
        from gc_worker.llm.budget import USAGE_CEILING

        settings = Settings.model_validate(  # a token budget the figure can't end
            {"embeddings": {"dim": TEST_DIM}, "llm": {"max_tokens_per_run": 10**15}}
        )
        ids = [add(engine, "u1", "u1 plays the piano"), add(engine, "u2", "u2 sings")]

        def answer(kind: str, payload: Any) -> Any:
            body = json.loads(chat_reply(scores_all(kind, payload)).content)
            body["usage"]["prompt_tokens"] = tokens  # json.dumps writes inf as Infinity
            return httpx2.Response(200, content=json.dumps(body).encode(),
                                   headers={"content-type": "application/json"})  # fmt: skip

        llm = make_llm(Model(answer), max_tokens_per_run=10**15)
        report = run(engine, settings, llm=llm, jobs=["importance"])
        assert report["status"] == "completed"
        assert [get(engine, i)["importance"] for i in ids] == [4, 4]
        counted = report["llm"]["input_tokens"]  # Infinity is no figure: none counted
        assert counted <= report["llm"]["calls"] * USAGE_CEILING and (counted > 0) == (
            tokens == 2**63
        )


class TestAFaithfulSummaryIsNotRejected:
    """The inversion checks must not refuse a summary that is its rows joined (a review found
    the first version of them rejecting it)."""

    def test_user_cap_summarizes_when_the_summary_is_the_rows_verbatim(self, engine, make_llm):
        settings = Settings.model_validate(
            {"embeddings": {"dim": TEST_DIM},
             "user_cap": {"max_memories": 2, "overflow": "summarize"}}
        )  # fmt: skip
        texts = ["User moved from Boston to Denver", "User works remotely as a designer",
                 "Core goal: sail"]  # fmt: skip
        for i, text in enumerate(texts):
            add(engine, "u1", text, importance=1 + 4 * (i == 2), created_at=days_ago(30 - i),
                embedding=unit(0.1 * i))  # fmt: skip
        summary = "User moved from Boston to Denver. User works remotely as a designer."
        server = Model(lambda kind, payload: {"summary": summary})
        report = run(engine, settings, jobs=["user_cap"], llm=make_llm(server))
        [created] = [a for a in report["actions"] if a["action"] == "create_merged"]
        assert get(engine, UUID(created["memory_id"]))["content"] == summary


class TestOneUsersRefusedSummaryDoesNotStopTheBatch:
    def test_a_400_for_one_user_leaves_the_next_users_summarised(self, engine, make_llm):
        """A request the server refuses for its content (400: context length exceeded for the
        user furthest over the cap, a content filter) says nothing about the server being
        down: the next over-cap user's summary is still asked for and made."""
        settings = Settings.model_validate(
            {"embeddings": {"dim": TEST_DIM},
             "user_cap": {"max_memories": 1, "overflow": "summarize"}}
        )  # fmt: skip
        for user in ("a_big", "b_small"):
            for i, word in enumerate(["piano", "jazz", "chess"]):
                add(engine, user, f"{user} plays {word}", created_at=days_ago(10 - i))

        def answer(kind: str, payload: Any) -> Any:
            if "a_big" in json.dumps(payload):
                return error_reply(400)  # e.g. context_length_exceeded
            return {"summary": "b_small plays piano and jazz"}

        server = Model(answer)
        report = run(engine, settings, jobs=["user_cap"], llm=make_llm(server, max_retries=1))
        made = {a["user_id"] for a in report["actions"] if a["action"] == "create_merged"}
        deferred = {a["user_id"] for a in report["actions"] if a["action"] == "deferred"}
        assert (made, deferred) == ({"b_small"}, {"a_big"})


class TestAGatewayRefusingEverything:
    @pytest.mark.parametrize("job", ["user_cap", "importance"])
    def test_is_not_asked_once_per_question_for_the_whole_batch(self, engine, make_llm, job):
        """A 400 refuses one request for its content — but a gateway answering 400 to
        everything (a response format the model does not support) was asked once per
        over-cap user or importance batch, up to 500 a batch, every night (a review found
        it). After MAX_REFUSALS in a row with no answer between, the server counts as down."""
        from jobs.llm_support import MAX_REFUSALS

        settings = Settings.model_validate(
            {"embeddings": {"dim": TEST_DIM},
             "user_cap": {"max_memories": 1, "overflow": "summarize"},
             "importance": {"batch_size": 1}}
        )  # fmt: skip
        users = [f"u{i:02d}" for i in range(12)]
        assessed = None if job == "importance" else days_ago(1)
        for user in users if job == "user_cap" else users[:1]:
            for i in range(3 if job == "user_cap" else 12):
                add(engine, user, f"{user} memory {i}", created_at=days_ago(10 - i / 2),
                    importance_assessed_at=assessed)  # fmt: skip
        server = Model(lambda kind, payload: error_reply(400))
        report = run(engine, settings, jobs=[job], llm=make_llm(server, max_retries=1))
        deferred = [a for a in report["actions"] if a["action"] == "deferred"]
        assert deferred and all(a["reason"] == "llm_unavailable" for a in deferred)
        assert server.chat_requests() == MAX_REFUSALS
