"""Question loader: file resolution, checksum, offline errors, selection, multi-turn prompts."""
import hashlib
import json
import urllib.error

import pytest

from evaluation import questions as Q

SUBS = Q.MT_BENCH_SUBCATEGORIES


def _questions():
    qs, qid = [], 81
    for sub in SUBS:
        for _ in range(3):
            qs.append({"question_id": qid, "category": sub, "turns": [f"{sub} t1 {qid}", f"{sub} t2 {qid}"]})
            qid += 1
    for cat in ("translation", "summarization", "qa", "math_reasoning", "rag"):
        for _ in range(3):
            qs.append({"question_id": qid, "category": cat, "turns": [f"{cat} {qid}"]})
            qid += 1
    return qs


def _jsonl(qs):
    return "".join(json.dumps(q) + "\n" for q in qs).encode()


def test_explicit_and_default_paths(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_bytes(_jsonl(_questions()))
    assert Q.resolve_question_file(f) == f
    assert Q.resolve_question_file(default_path=f) == f
    with pytest.raises(FileNotFoundError):
        Q.resolve_question_file(tmp_path / "missing.jsonl")
    assert len(Q.load_questions(f)) == 8 * 3 + 5 * 3


def test_download_checked_and_saved(tmp_path, monkeypatch):
    data = _jsonl(_questions())
    monkeypatch.setattr(Q, "fetch_url", lambda url: data)
    dest = tmp_path / "spec_bench" / "question.jsonl"
    got = Q.resolve_question_file(default_path=dest, sha256=hashlib.sha256(data).hexdigest())
    assert got == dest and dest.read_bytes() == data


def test_download_sha_mismatch_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(Q, "fetch_url", lambda url: b"tampered\n")
    dest = tmp_path / "spec_bench" / "question.jsonl"
    with pytest.raises(Q.QuestionFileError, match="sha256") as e:
        Q.resolve_question_file(default_path=dest)
    assert Q.SPEC_BENCH_SHA256 in str(e.value) and "--question-file" in str(e.value)
    assert not dest.exists()
    assert not dest.parent.exists() or not any(dest.parent.iterdir())


def test_offline_error_names_options(tmp_path, monkeypatch):
    def offline(url):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(Q, "fetch_url", offline)
    dest = tmp_path / "question.jsonl"
    with pytest.raises(Q.QuestionFileError) as e:
        Q.resolve_question_file(default_path=dest)
    msg = str(e.value)
    assert "--question-file PATH" in msg and str(dest) in msg
    with pytest.raises(Q.QuestionFileError, match="--question-file"):
        Q.resolve_question_file(default_path=dest, download=False)


def test_per_category_selection_spreads_mt_bench():
    qs = _questions()
    sel = Q.select_questions(qs, per_category=2)
    groups = [Q.category_group(q["category"]) for q in sel]
    assert groups == [g for g in Q.CATEGORY_GROUPS for _ in range(2)]
    assert [q["category"] for q in sel[:2]] == ["writing", "roleplay"]
    sel10 = Q.select_questions(qs, categories=["mt_bench"], per_category=10)
    assert [q["category"] for q in sel10] == list(SUBS) + ["writing", "roleplay"]
    assert [q["question_id"] for q in sel10[-2:]] == [82, 85]          # second question of each sub-category
    assert len(Q.select_questions(qs, categories=["mt_bench"])) == 24   # None = all
    assert [q["category"] for q in Q.select_questions(qs, ["qa", "math"], 1)] == ["math", "qa"]
    with pytest.raises(ValueError, match="unknown categories"):
        Q.select_questions(qs, ["poetry"])


def test_real_file_if_present():
    import pathlib

    p = pathlib.Path("/work/shared/specbench/question.jsonl")
    if not p.exists():
        pytest.skip("shared Spec-Bench copy not present")
    sel = Q.select_questions(Q.load_questions(p), per_category=8)
    assert len(sel) == 48 and len({q["category"] for q in sel[:8]}) == 8


class _ChatTok:
    """Minimal tokenizer: the chat template joins role markers and contents; one id per character."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        assert tokenize is False
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}


def test_multi_turn_prompt_contains_turn1_answer():
    msgs = Q.build_messages(["q1", "q2"], ["my answer"])
    assert msgs == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "my answer"},
                    {"role": "user", "content": "q2"}]
    ids = Q.build_prompt_ids(_ChatTok(), msgs)
    assert "".join(map(chr, ids)) == "<user>q1<assistant>my answer<user>q2<assistant>"
    with pytest.raises(ValueError):
        Q.build_messages(["q1", "q2"], [])


def test_selection_and_report_sets_are_disjoint():
    """The head was chosen on the first 10 questions per group; the report set is every other one."""
    from evaluation.questions import question_sets

    qs = []
    for g, n in (("writing", 12), ("roleplay", 12), ("translation", 15), ("qa", 11)):
        for _ in range(n):
            qs.append({"question_id": len(qs) + 1, "category": g, "turns": ["x"]})
    sets = question_sets(qs, selection_per_category=10)
    sel = {q["question_id"] for q in sets["selection"]}
    rep = {q["question_id"] for q in sets["report"]}
    assert not sel & rep and sel | rep == {q["question_id"] for q in qs}
    assert len(sets["selection"]) == 10 + 10 + 10  # mt_bench counts as one group
    assert {q["question_id"] for q in sets["selection"] if q["category"] == "translation"} == set(range(25, 35))


def test_question_set_flag(tmp_path):
    import json

    from evaluation import arguments as A

    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": ["q"]}) + "\n" for i in range(1, 16)))
    rep = A.check_question_file(str(f), None, 2, question_set="report")
    assert [q["question_id"] for q in rep] == [11, 12]
    with pytest.raises(A.UsageError, match="^--question-set"):
        A.check_question_file(str(f), None, 2, question_set="bogus")


def test_an_empty_question_file_names_the_file_flag(tmp_path):
    """An empty file is the file's fault, not the categories' (it used to blame --categories)."""
    from evaluation import arguments as A

    f = tmp_path / "empty.jsonl"
    f.write_text("")
    with pytest.raises(A.UsageError, match="^--question-file: .*holds no questions") as e:
        A.check_question_file(str(f), ["writing"], 1)
    assert "\n" not in str(e.value)
