"""Conversation sources: real ShareGPT records, JSON/JSONL streaming, byte offsets, bad input."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle_io.data import embedded
from eagle_io.data.json_stream import iter_raw_records
from eagle_io.data.sources import (
    Conversation,
    DatasetFormatError,
    conversation_from_record,
    iter_conversations,
)
from eagle_io.data.stats import SkipStats

FIXTURES = Path(__file__).parent / "fixtures" / "data"
SLICE = FIXTURES / "sharegpt_real_slice.json"
SLICE_META = json.loads((FIXTURES / "sharegpt_real_slice.meta.json").read_text())


def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def _json_list_with_offsets(records: list, indent: int | None = 2) -> tuple[bytes, list[int]]:
    """Serialise like ShareGPT (a pretty-printed list) and return each record's byte offset."""
    parts, offsets, pos = [b"[\n"], [], 2
    for i, record in enumerate(records):
        body = json.dumps(record, indent=indent, ensure_ascii=False).encode("utf-8")
        offsets.append(pos)
        sep = b",\n" if i < len(records) - 1 else b"\n"
        parts += [body, sep]
        pos += len(body) + len(sep)
    parts.append(b"]\n")
    return b"".join(parts), offsets


SHAREGPT = [
    {"id": "a_0", "conversations": [{"from": "human", "value": "héllo 😀"}, {"from": "gpt", "value": "hi"}]},
    {"id": "b_0", "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}]},
    {"id": "c_0", "conversations": [{"from": "human", "value": "日本語"}, {"from": "bing", "value": "ok"}]},
    {"id": "d_0", "conversations": []},
]


# --- the real ShareGPT slice -------------------------------------------------------------


def test_real_slice_roles_ids_and_indices() -> None:
    convs = list(iter_conversations(SLICE))
    raw = json.loads(SLICE.read_text(encoding="utf-8"))
    assert [c.index for c in convs] == list(range(21))
    assert [c.id for c in convs] == [r["id"] for r in raw]
    assert convs[0].id == "QWJhYvA_0" and len(convs[0].messages) == 12
    by_id = {c.id: c for c in convs}
    # ChatHub exports: a share banner as system turn, then the user and bing/chatgpt/bard replies
    assert [m["role"] for m in by_id["52n0vlZ_0"].messages] == ["system", "user", "assistant"]
    assert by_id["52n0vlZ_0"].messages[2]["content"].startswith("Hello, this is Bing.")
    assert [m["role"] for m in by_id["yV4WPEy_0"].messages] == ["system", "user", "assistant"]
    assert [m["role"] for m in by_id["95NWF4s_0"].messages] == ["system"] + ["user", "assistant"] * 2
    assert [m["role"] for m in by_id["JPSehOX_0"].messages] == ["user", "assistant"]  # raw role "user"
    assert by_id["ZUkSe7V_0"].messages == []  # empty conversations are records too
    # every role is normalised; contents are the raw values
    roles = Counter(m["role"] for c in convs for m in c.messages)
    assert set(roles) == {"system", "user", "assistant"}
    flat_raw = [t["value"] for r in raw for t in r["conversations"]]
    assert [m["content"] for c in convs for m in c.messages] == flat_raw


def test_real_slice_byte_offsets_point_at_each_record() -> None:
    data = SLICE.read_bytes()
    raw = json.loads(data)
    with SLICE.open("rb") as stream:
        records = list(iter_raw_records(stream, chunk_size=4096))  # many window refills
    assert [r.value for r in records] == raw
    decoder = json.JSONDecoder()
    for rec in records:
        assert data[rec.byte_offset : rec.byte_offset + 1] == b"{"
        text = data[rec.byte_offset :].decode("utf-8")
        assert decoder.raw_decode(text)[0] == raw[rec.index]


# --- layouts and shapes --------------------------------------------------------------------


def test_jsonl_and_json_list_give_the_same_conversations(tmp_path: Path) -> None:
    as_list = _write(tmp_path / "d.json", json.dumps(SHAREGPT))
    as_jsonl = _write(tmp_path / "d.jsonl", "".join(json.dumps(r) + "\n" for r in SHAREGPT))
    a, b = list(iter_conversations(as_list)), list(iter_conversations(as_jsonl))
    assert a == b
    assert a[2] == Conversation(
        2, "c_0", [{"role": "user", "content": "日本語"}, {"role": "assistant", "content": "ok"}]
    )


def test_openai_messages_from_file_and_from_an_iterable(tmp_path: Path) -> None:
    records = [
        {"id": 7, "messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
        {
            "messages": [
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
                },
                {"role": "user", "content": "x"},
            ]
        },
    ]
    path = _write(tmp_path / "m.jsonl", "\n".join(json.dumps(r) for r in records) + "\n")
    from_file = list(iter_conversations(path))
    from_iter = list(iter_conversations(iter(records)))  # e.g. a datasets.Dataset
    assert from_file == from_iter
    assert from_file[0].id == "7"  # integer ids become strings
    assert from_file[1].id is None
    assert from_file[1].messages[0] == {"role": "system", "content": "be brief"}


def test_blank_jsonl_lines_are_not_records(tmp_path: Path) -> None:
    lines = ["", json.dumps(SHAREGPT[0]), "   ", json.dumps(SHAREGPT[2]), ""]
    path = _write(tmp_path / "d.jsonl", "\n".join(lines))
    assert [(c.index, c.id) for c in iter_conversations(path)] == [(0, "a_0"), (1, "c_0")]


def test_bom_is_skipped_and_counted_in_offsets(tmp_path: Path) -> None:
    body, offsets = _json_list_with_offsets(SHAREGPT)
    path = _write(tmp_path / "bom.json", b"\xef\xbb\xbf" + body)
    with path.open("rb") as stream:
        assert [r.byte_offset for r in iter_raw_records(stream)] == [o + 3 for o in offsets]


@settings(max_examples=40, deadline=None)
@given(
    records=st.lists(
        st.fixed_dictionaries(
            {
                "id": st.text(max_size=5),
                "conversations": st.lists(
                    st.fixed_dictionaries({"from": st.sampled_from(["human", "gpt"]), "value": st.text(max_size=40)}),
                    max_size=3,
                ),
            }
        ),
        max_size=6,
    ),
    chunk_size=st.integers(min_value=1, max_value=64),
    indent=st.sampled_from([None, 0, 2]),
)
def test_stream_matches_json_load_for_any_chunking(records: list, chunk_size: int, indent: int | None) -> None:
    import io

    data, offsets = _json_list_with_offsets(records, indent=indent)
    got = list(iter_raw_records(io.BytesIO(data), chunk_size=chunk_size))
    assert [r.error for r in got] == [None] * len(records)
    assert [r.value for r in got] == json.loads(data)
    assert [r.byte_offset for r in got] == offsets


# --- malformed input -----------------------------------------------------------------------


def test_truncated_json_list_names_record_and_offset(tmp_path: Path) -> None:
    data, offsets = _json_list_with_offsets(SHAREGPT)
    cut = offsets[2] + 25  # inside record 2 (which holds multi-byte characters)
    path = _write(tmp_path / "cut.json", data[:cut])
    seen = []
    with pytest.raises(DatasetFormatError) as info:
        seen.extend(c.id for c in iter_conversations(path))
    err = info.value
    assert seen == ["a_0", "b_0"]
    assert (err.path, err.record, err.byte_offset, err.reason) == (str(path), 2, offsets[2], "truncated")
    assert f"record 2 at byte offset {offsets[2]}" in str(err) and str(path) in str(err)


def test_every_truncation_point_is_reported_as_truncated() -> None:
    import io

    data, offsets = _json_list_with_offsets(SHAREGPT[:3])
    ends = [
        o + len(json.dumps(r, indent=2, ensure_ascii=False).encode())
        for o, r in zip(offsets, SHAREGPT[:3], strict=True)
    ]
    for cut in range(1, len(data) - 2):  # up to (not including) the closing bracket
        got = list(iter_raw_records(io.BytesIO(data[:cut]), chunk_size=7))
        complete = sum(end <= cut for end in ends)
        assert [r.index for r in got if r.error is None] == list(range(complete)), cut
        last = got[-1]
        assert (last.error, last.fatal, last.index) == ("truncated", True, complete), cut
        inside_record = complete < 3 and cut > offsets[complete]
        assert last.byte_offset == (offsets[complete] if inside_record else cut), cut


def test_syntax_error_inside_a_json_list_is_invalid_json_even_when_skipping(tmp_path: Path) -> None:
    data, offsets = _json_list_with_offsets(SHAREGPT)
    broken = data.replace(b'"from": "bing"', b'"from": bing', 1)
    path = _write(tmp_path / "bad.json", broken)
    stats = SkipStats()
    with pytest.raises(DatasetFormatError) as info:
        list(iter_conversations(path, on_error="skip", stats=stats))
    assert (info.value.record, info.value.byte_offset, info.value.reason) == (2, offsets[2], "invalid_json")


def test_invalid_jsonl_line_names_record_and_line_start(tmp_path: Path) -> None:
    lines = [json.dumps(SHAREGPT[0]), "", json.dumps(SHAREGPT[1]), '{"id": "x", "conversations": [', "{}"]
    text = "\n".join(lines) + "\n"
    path = _write(tmp_path / "bad.jsonl", text)
    bad_start = len("\n".join(lines[:3]).encode()) + 1
    with pytest.raises(DatasetFormatError) as info:
        list(iter_conversations(path))
    assert (info.value.record, info.value.byte_offset, info.value.reason) == (2, bad_start, "invalid_json")
    assert "line 4" in str(info.value)


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (["not", "an", "object"], "not_an_object"),
        ({"id": "x"}, "bad_shape"),
        ({"id": "x", "conversations": "hello"}, "bad_shape"),
        ({"conversations": [], "messages": []}, "bad_shape"),
        ({"conversations": [{"from": "human"}]}, "bad_turn"),
        ({"conversations": ["hi"]}, "bad_turn"),
        ({"conversations": [{"from": "narrator", "value": "x"}]}, "unknown_role"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "unknown_role"),
        ({"conversations": [{"from": "gpt", "value": 42}]}, "non_string_content"),
        ({"messages": [{"role": "assistant", "content": None}]}, "non_string_content"),
        ({"id": {"x": 1}, "conversations": []}, "bad_id"),
    ],
)
def test_wrong_record_shape_raises_with_record_and_offset(tmp_path: Path, record: object, reason: str) -> None:
    records = [SHAREGPT[0], SHAREGPT[1], record, SHAREGPT[2]]
    data, offsets = _json_list_with_offsets(records)
    path = _write(tmp_path / "shape.json", data)
    with pytest.raises(DatasetFormatError) as info:
        list(iter_conversations(path))
    assert (info.value.record, info.value.byte_offset, info.value.reason) == (2, offsets[2], reason)
    with pytest.raises(DatasetFormatError) as info:
        conversation_from_record(record, 9)
    assert (info.value.record, info.value.byte_offset, info.value.path) == (9, None, None)


def test_skip_policy_counts_every_skipped_record(tmp_path: Path) -> None:
    lines = [
        json.dumps(SHAREGPT[0]),
        "{not json",
        json.dumps({"conversations": [{"from": "narrator", "value": "x"}]}),
        json.dumps(SHAREGPT[1]),
        json.dumps([1, 2]),
        json.dumps({"conversations": [{"from": "robot", "value": "x"}]}),
        json.dumps(SHAREGPT[2]),
        '{"id": "cut", "conversations": [{"from": "hu',  # last line, no newline: truncated
    ]
    path = _write(tmp_path / "mixed.jsonl", "\n".join(lines))
    stats = SkipStats()
    kept = list(iter_conversations(path, on_error="skip", stats=stats))
    assert [(c.index, c.id) for c in kept] == [(0, "a_0"), (3, "b_0"), (6, "c_0")]
    assert stats.skipped == Counter({"unknown_role": 2, "invalid_json": 1, "not_an_object": 1, "truncated": 1})
    assert stats.examples["unknown_role"] == [2, 5]
    assert stats.total_skipped == 5 == len(lines) - len(kept)


def test_skip_policy_on_a_truncated_json_list_keeps_the_complete_records(tmp_path: Path) -> None:
    data, offsets = _json_list_with_offsets(SHAREGPT)
    path = _write(tmp_path / "cut.json", data[: offsets[3] + 4])
    stats = SkipStats()
    kept = list(iter_conversations(path, on_error="skip", stats=stats))
    assert [c.id for c in kept] == ["a_0", "b_0", "c_0"]
    assert stats.skipped == Counter({"truncated": 1}) and stats.examples == {"truncated": [3]}


def test_skip_policy_on_an_iterable(tmp_path: Path) -> None:
    stats = SkipStats()
    kept = list(iter_conversations([SHAREGPT[0], "junk", SHAREGPT[1]], on_error="skip", stats=stats))
    assert [c.index for c in kept] == [0, 2]
    assert stats.skipped == Counter({"not_an_object": 1})
    with pytest.raises(DatasetFormatError, match=r"<iterable>: record 1 at byte offset n/a"):
        list(iter_conversations([SHAREGPT[0], "junk"]))


@pytest.mark.parametrize(
    ("content", "reason", "record"),
    [
        (b"", "empty_file", 0),
        (b"  \n", "empty_file", 0),
        (b"hello", "not_json", 0),
        (b"[]x", "invalid_json", 0),
    ],
)
def test_unreadable_files(tmp_path: Path, content: bytes, reason: str, record: int) -> None:
    path = _write(tmp_path / "f.json", content)
    for policy in ("raise", "skip"):
        with pytest.raises(DatasetFormatError) as info:
            list(iter_conversations(path, on_error=policy, stats=SkipStats()))
        assert (info.value.reason, info.value.record) == (reason, record)


def test_empty_list_is_an_empty_dataset(tmp_path: Path) -> None:
    assert list(iter_conversations(_write(tmp_path / "e.json", " [ ] \n"))) == []


def test_bad_policy_arguments() -> None:
    with pytest.raises(ValueError, match="on_error"):
        list(iter_conversations([], on_error="ignore"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="SkipStats"):
        list(iter_conversations([], on_error="skip"))


# --- embedded packages -----------------------------------------------------------------------


def test_embedded_paths_exist() -> None:
    directory, name = embedded.default_model_path()
    assert name == "SmolLM2-135M-Instruct.Q4_1.gguf" and (directory / name).stat().st_size > 50_000_000
    path = embedded.default_dataset_path()
    assert path.name == "ShareGPT_V3_unfiltered_cleaned_split.json"
    with path.open("rb") as stream:
        assert stream.read(1) == b"["


def test_missing_package_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "MODEL_PACKAGE", "eagle-io-no-such-package")
    with pytest.raises(embedded.MissingDataPackageError, match="pip install eagle-io-no-such-package") as info:
        embedded.default_model_path()
    assert info.value.package == "eagle-io-no-such-package"


# --- the full shipped file (slow) ------------------------------------------------------------


@pytest.mark.slow
def test_full_sharegpt_file_is_cut_after_record_17670() -> None:
    path = embedded.default_dataset_path()
    stats = SkipStats()
    convs = list(iter_conversations(path, on_error="skip", stats=stats))
    assert len(convs) == 17671 and convs[-1].index == 17670
    assert stats.skipped == Counter({"truncated": 1}) and stats.examples["truncated"] == [17671]
    roles = Counter(m["role"] for c in convs for m in c.messages)
    assert roles == Counter({"assistant": 67594 + 8 + 4 + 2, "user": 61420 + 2, "system": 41})
    assert sum(not c.messages for c in convs) == 126
    slice_convs = list(iter_conversations(SLICE))
    for conv, source_index in zip(slice_convs, SLICE_META["source_indices"], strict=True):
        assert convs[source_index].id == conv.id and convs[source_index].messages == conv.messages
    with pytest.raises(DatasetFormatError) as info:
        for _ in iter_conversations(path):
            pass
    assert (info.value.record, info.value.byte_offset, info.value.reason) == (17671, 125506645, "truncated")


@pytest.mark.parametrize("chunk_size", [5, 1 << 20])
def test_invalid_utf8_names_the_record_that_holds_it(tmp_path: Path, chunk_size: int) -> None:
    data, offsets = _json_list_with_offsets(SHAREGPT)
    bad_at = data.index("日本語".encode())
    path = _write(tmp_path / "u.json", data[:bad_at] + b"\xff" + data[bad_at + 1 :])
    stats = SkipStats()
    seen = []
    with pytest.raises(DatasetFormatError) as info:
        seen.extend(c.index for c in iter_conversations(path, on_error="skip", stats=stats, chunk_size=chunk_size))
    assert seen == [0, 1]
    assert (info.value.record, info.value.byte_offset, info.value.reason) == (2, offsets[2], "invalid_json")
    assert f"invalid UTF-8 at byte offset {bad_at}" in str(info.value)
    jsonl = _write(tmp_path / "u.jsonl", b'{"conversations": []}\n{"conversations": [], "id": "\xff"}\n')
    with pytest.raises(DatasetFormatError) as info:
        list(iter_conversations(jsonl))
    assert (info.value.record, info.value.byte_offset, info.value.reason) == (1, 22, "invalid_json")
