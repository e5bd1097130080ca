"""Manifest format: writing, reading, refusals with file:line, diffs (pure, no filesystem but tmp files)."""

from __future__ import annotations

import hashlib

import pytest

from hermetic.data.manifest import (
    Manifest, ManifestError, _columns_fast, _parse_slow, encode_path, format_manifest,
    make_manifest, parse_manifest, read_manifest,
)
from hermetic.core.errors import HermeticError

H1 = hashlib.sha256(b"one").hexdigest()
H2 = hashlib.sha256(b"two").hexdigest()
H3 = hashlib.sha256(b"three").hexdigest()


def refused(text: str, source: str = "m.txt") -> str:
    with pytest.raises(ManifestError) as e:
        parse_manifest(text.encode("utf-8"), source)
    assert isinstance(e.value, HermeticError)
    assert "\n" not in str(e.value)
    return str(e.value)


# ---------------------------------------------------------------- writing


def test_format_is_sorted_by_utf8_bytes_with_two_spaces_and_lf() -> None:
    entries = {"z": H1, "B": H2, "a/b": H3, "é": H1, "a b": H2}
    text = format_manifest(entries).decode("utf-8")
    names = [line[66:] for line in text.splitlines()]
    assert names == sorted(names, key=lambda s: s.encode("utf-8"))
    assert names == ["B", "a b", "a/b", "z", "é"]
    assert text.endswith("\n") and "\r" not in text
    assert all(line[64:66] == "  " for line in text.splitlines())


def test_cr_lf_and_percent_are_percent_encoded_and_round_trip() -> None:
    entries = {"100%.txt": H1, "two\nlines": H2, "cr\rname": H3}
    data = format_manifest(entries)
    assert b"100%25.txt" in data and b"two%0Alines" in data and b"cr%0Dname" in data
    assert data.count(b"\n") == 3
    assert parse_manifest(data).entries == entries
    assert encode_path("plain name") == "plain name"


def test_manifest_sha256_is_the_sha256_of_the_bytes() -> None:
    m = make_manifest({"a": H1, "b": H2}, total_bytes=6)
    assert m.sha256 == hashlib.sha256(format_manifest(m.entries)).hexdigest()
    assert m.oxum == "6.2" and m.file_count == 2
    assert parse_manifest(format_manifest(m.entries)).sha256 == m.sha256


def test_format_refuses_paths_that_could_not_be_read_back() -> None:
    with pytest.raises(ValueError):
        format_manifest({"../x": H1})


# ---------------------------------------------------------------- reading what sha256sum reads


def test_reads_sha256sum_variants() -> None:
    text = (f"{H1.upper()} *bin.dat\r\n"      # uppercase hex, binary marker, CRLF
            f"{H2}  ./dot/slash\n"           # what `find . | xargs sha256sum` writes
            f"\\{H3}  back\\\\slash\\nnewline\n"  # GNU escaped line
            f"{H1} single space\n")
    m = parse_manifest(text)
    assert m.entries == {"bin.dat": H1, "dot/slash": H2, "back\\slash\nnewline": H3, "single space": H1}


def test_backslash_in_plain_line_is_literal_as_for_sha256sum() -> None:
    assert parse_manifest(f"{H1}  a\\b\n").entries == {"a\\b": H1}


def test_empty_manifest_is_an_empty_dataset() -> None:
    m = parse_manifest(b"")
    assert m.entries == {} and m.sha256 == hashlib.sha256(b"").hexdigest()


def test_last_line_without_newline_is_accepted() -> None:
    assert parse_manifest(f"{H1}  a\n{H2}  b").entries == {"a": H1, "b": H2}


def test_fast_and_careful_parsers_agree() -> None:
    lines = [f"{H1 if i % 2 else H2.upper()}{' *' if i % 3 == 0 else '  '}dir{i % 7}/file {i}.bin" for i in range(500)]
    fast = _columns_fast(lines)
    assert fast is not None
    assert dict(zip(fast[0], [fast[1][i:i + 32].hex() for i in range(0, len(fast[1]), 32)])) == _parse_slow(lines, "x")


# ---------------------------------------------------------------- refusals, each with file:line


def test_refuses_dotdot() -> None:
    msg = refused(f"{H1}  ok\n{H2}  a/../../etc/passwd\n")
    assert msg.startswith("m.txt:2: '..' in path")


def test_refuses_absolute_path() -> None:
    assert refused(f"{H1}  /etc/passwd\n").startswith("m.txt:1: absolute path")


def test_refuses_duplicate_entries() -> None:
    msg = refused(f"{H1}  a\n{H2}  b\n{H3}  a\n")
    assert msg.startswith("m.txt:3: duplicate entry for 'a' (first on line 1)")


def test_refuses_duplicate_spelled_with_dot_slash() -> None:
    assert refused(f"{H1}  a\n{H2}  ./a\n").startswith("m.txt:2: duplicate entry")


def test_refuses_non_hex_hash() -> None:
    bad = "g" + H1[1:]
    assert refused(f"{H1}  a\n{bad}  b\n").startswith("m.txt:2: hash ")
    assert "not hexadecimal" in refused(f"{bad}  b\n")


def test_refuses_short_hash_saying_how_long_it_is() -> None:
    md5 = hashlib.md5(b"x").hexdigest()
    assert refused(f"{md5}  a\n") == "m.txt:1: hash has 32 hex digits; a sha256 has 64"


def test_refuses_long_hash() -> None:
    sha512 = hashlib.sha512(b"x").hexdigest()
    assert refused(f"{sha512}  a\n") == "m.txt:1: hash has 128 hex digits; a sha256 has 64"


def test_refuses_bad_lines() -> None:
    assert refused(f"{H1}  a\nnot a manifest line\n").startswith("m.txt:2: not a '<sha256>  <path>' line")
    assert refused(f"{H1}  a\n\n{H2}  b\n") == "m.txt:2: empty line"
    assert refused(f"SHA256 (a) = {H1}\n").startswith("m.txt:1: not a")
    assert refused(f"{H1}\n").startswith("m.txt:1: ")
    assert refused(f"{H1}xa\n").startswith("m.txt:1: ")


def test_refuses_empty_and_dot_components() -> None:
    assert "empty path component" in refused(f"{H1}  a//b\n")
    assert "empty path component" in refused(f"{H1}  dir/\n")
    assert "'.' component" in refused(f"{H1}  a/./b\n")
    assert "empty path" in refused(f"{H1}  \n")


def test_refuses_bad_percent_encoding() -> None:
    msg = refused(f"{H1}  a\n{H2}  50%off\n")
    assert msg.startswith("m.txt:2: bad percent-encoding") and "%25" in msg


def test_refuses_names_equal_under_unicode_normalization() -> None:
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    msg = refused(f"{H1}  {nfc}\n{H2}  {nfd}\n")
    assert msg.startswith("m.txt:2: ") and "Unicode normalization" in msg and "line 1" in msg


def test_refuses_non_utf8() -> None:
    with pytest.raises(ManifestError, match=r"^m.txt:2: not UTF-8"):
        parse_manifest(f"{H1}  a\n{H2}  ".encode() + b"\xff\xfe\n", "m.txt")


def test_read_manifest_names_the_file(tmp_path) -> None:
    p = tmp_path / "train.sha256"
    p.write_text(f"{H1}  a\n{H2}  ../b\n")
    with pytest.raises(ManifestError, match=rf"^{p}:2: '\.\.' in path"):
        read_manifest(p)
    with pytest.raises(ManifestError, match="no such manifest file"):
        read_manifest(tmp_path / "absent.sha256")
