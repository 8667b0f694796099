from uma_serve.core.textstream import TextStream


def feed(stream: TextStream, pieces: list[bytes]) -> list[str]:
    return [stream.push(piece) for piece in pieces]


def test_utf8_split_across_tokens_is_held() -> None:
    s = TextStream()
    euro = "€".encode()
    assert feed(s, [b"a", euro[:1], euro[1:2], euro[2:] + b"b"]) == ["a", "", "", "€b"]
    assert s.flush() == ""


def test_lone_partial_character_at_end_becomes_replacement() -> None:
    s = TextStream()
    assert s.push("é".encode()[:1]) == ""
    assert s.flush() == "\ufffd"


def test_stop_string_inside_one_piece() -> None:
    s = TextStream(["END"])
    assert s.push(b"hello END world") == "hello "
    assert s.stopped


def test_stop_string_across_pieces_never_leaks() -> None:
    s = TextStream(["###"])
    out = feed(s, [b"ab#", b"#", b"#tail"])
    assert out == ["ab", "", ""]
    assert s.stopped and "".join(out) == "ab"


def test_partial_match_released_when_it_diverges() -> None:
    s = TextStream(["###"])
    assert feed(s, [b"x#", b"#y"]) == ["x", "##y"]
    assert not s.stopped


def test_held_partial_released_at_flush() -> None:
    s = TextStream(["STOP"])
    assert s.push(b"ends with ST") == "ends with "
    assert s.flush() == "ST"


def test_earliest_of_several_stops_wins() -> None:
    s = TextStream(["b", "a"])
    assert s.push(b"xxab") == "xx"
