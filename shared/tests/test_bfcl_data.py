"""The BFCL data helpers datagen and egpo share, and the one call-string format."""

import json

from palaestra.shared.bfcl_data import read_entries, user_texts, word_ngrams
from palaestra.shared.toolcall import call_string


def test_word_ngrams_and_user_texts():
    assert word_ngrams("Move 'a.txt' to /tmp, NOW", 2) == {("move", "a"), ("a", "txt"), ("txt", "to"),
                                                         ("to", "tmp"), ("tmp", "now")}  # fmt: skip
    assert word_ngrams("too short", 3) == set()
    question = [[{"role": "user", "content": "first"}, {"role": "assistant", "content": "x"}],
                {"role": "user", "content": "second"}, [{"role": "user", "content": 3}]]  # fmt: skip
    assert user_texts(question) == ["first", "second"]


def test_read_entries_lines_or_one_document(tmp_path):
    lines, doc = tmp_path / "a.json", tmp_path / "b.json"
    lines.write_text('{"id": 1}\n\n{"id": 2}\n')
    doc.write_text(json.dumps([{"id": 3}, 4], indent=2))
    assert read_entries(lines) == [{"id": 1}, {"id": 2}]
    assert read_entries(doc) == [{"id": 3}]


def test_call_string_is_python_keyword_call():
    text = call_string("mv", {"source": "a b.txt", "n": 2, "flag": None})
    assert text == "mv(source='a b.txt', n=2, flag=None)"
    import ast

    call = ast.parse(text).body[0].value
    assert not call.args and {k.arg: ast.literal_eval(k.value) for k in call.keywords} == {
        "source": "a b.txt",
        "n": 2,
        "flag": None,
    }
