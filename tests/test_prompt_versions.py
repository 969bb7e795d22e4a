"""A cached decision is keyed on its prompt's version, not on the prompt's text: an edit of a
system prompt, an instruction or an answer schema without a new version would serve decisions
made with the old text for good. Each prompt's fingerprint is recorded here with its version;
an edit fails this test until the version is bumped (gc_worker/llm/prompts.py) and the new
fingerprint recorded."""

from __future__ import annotations

import hashlib
import json
from uuid import UUID

from gc_worker.llm import decisions

A, B = str(UUID(int=1)), str(UUID(int=2))
MEMBERS = [(A, "Likes tea"), (B, "Likes green tea")]

RECORDED = {
    "merge.v2": "d27b9bed572e7c3f",
    "contradiction.v1": "bc02aa6f51d33494",
    "importance.v1": "6fea94c5ee32755a",
    "summary.v2": "a86f177145020922",
}


def fingerprints() -> dict[str, str]:
    requests = (
        decisions.merge_request(MEMBERS),
        decisions.contradiction_request(MEMBERS[0], MEMBERS[1]),
        decisions.importance_request(MEMBERS),
        decisions.summary_request(MEMBERS),
    )
    found = {}
    for request in requests:
        schema = json.dumps(request.answer_model.model_json_schema(), sort_keys=True)
        text = "\n".join((request.system, request.instruction, schema))
        found[request.prompt_version] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return found


def test_every_prompt_edit_comes_with_a_new_version():
    found = fingerprints()
    changed = {v: f for v, f in found.items() if RECORDED.get(v) != f}
    assert not changed, (
        f"prompt text or answer schema changed under an unchanged version: {changed}. Bump the "
        "version in gc_worker/llm/prompts.py (cached decisions were made with the old text), "
        "then record the new version and fingerprint in RECORDED"
    )
