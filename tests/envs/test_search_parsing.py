"""Tag parsing rules of the search envs (mas_envs.envs.search.common)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mas_envs.envs.search.common import ActionParse, first_block, last_block, parse_action


def test_search_valid():
    assert parse_action(
        "<think>need it</think><search> capital of Mongolia </search>", ("search",)
    ) == ActionParse("search", "capital of Mongolia", False, "")


def test_first_action_tag_wins_and_two_kinds_are_invalid():
    p = parse_action("<think>t</think><search>q</search> <answer>x</answer>", ("search",))
    assert (p.kind, p.content, p.invalid) == ("search", "q", True)
    assert "two different action tags" in p.reason
    p = parse_action("<think>t</think><answer>x</answer><search>q</search>", ("answer",))
    assert (p.kind, p.content, p.invalid) == ("answer", "x", True)


def test_last_answer_block_counts():
    p = parse_action("<think>t</think><answer>Lyon</answer> wait, no: <answer>Paris</answer>", ("answer",))
    assert (p.kind, p.content, p.invalid) == ("answer", "Paris", False)


def test_think_rules():
    assert parse_action("<search>q</search>", ("search",)).invalid  # missing think
    assert parse_action("<think>a</think><think>b</think><search>q</search>", ("search",)).invalid  # twice
    assert parse_action("<search>q</search><think>late</think>", ("search",)).invalid  # after the action
    assert parse_action("<think>unclosed <search>q</search>", ("search",)).invalid
    assert not parse_action("<search>q</search>", ("search",), require_think=False).invalid
    # the content is still used when only the format is wrong
    assert parse_action("<search>q</search>", ("search",)).content == "q"


def test_unclosed_empty_and_wrong_kind():
    p = parse_action("<think>t</think><search>q", ("search",))
    assert (p.kind, p.content, p.invalid, p.reason) == ("search", None, True, "unclosed <search> tag")
    p = parse_action("<think>t</think><search>  </search>", ("search",))
    assert (p.content, p.invalid, p.reason) == ("", True, "empty search query")
    p = parse_action("<think>t</think><answer>x</answer>", ("search",))
    assert (p.kind, p.invalid, p.reason) == ("answer", True, "<answer> is not this agent's action")
    p = parse_action("no tags at all", ("search", "answer"))
    assert (p.kind, p.content, p.invalid) == (None, None, True)


def test_tags_are_case_insensitive_and_span_lines():
    assert first_block("<VERIFY>Yes</Verify>", "verify") == "Yes"
    assert last_block("<answer>a\nb</answer>", "answer") == "a\nb"
    assert first_block("<verify>yes", "verify") is None


@given(st.text())
def test_parse_never_raises(text):
    p = parse_action(text, ("search", "answer"))
    assert p.kind in (None, "search", "answer") and isinstance(p.invalid, bool)


MB = 1 << 20


@pytest.mark.timeout(10)  # the old lazy regex took ~25 min on these inputs; the scan takes milliseconds
def test_megabyte_of_unclosed_tags_parses_in_linear_time():
    opens = "<answer>" * (MB // len("<answer>"))
    assert last_block(opens, "answer") is None
    assert first_block("<search>" * (MB // len("<search>")), "search") is None
    assert first_block("<verify>" * (MB // len("<verify>")), "verify") is None
    p = parse_action("<think>t</think>" + opens, ("answer",))
    assert (p.kind, p.content, p.invalid, p.reason) == ("answer", None, True, "unclosed <answer> tag")
    p = parse_action("<search>" * (MB // 8), ("search",), require_think=False)
    assert (p.kind, p.content, p.reason) == ("search", None, "unclosed <search> tag")
    # one closing tag at the very end: the block runs from the first opening tag, as the regex did
    n = MB // len("<answer>")
    assert last_block(opens + "</answer>", "answer") == "<answer>" * (n - 1)
    # a megabyte of complete blocks: the last one is graded
    many = "<answer>x</answer>" * (MB // 18) + "<answer>Paris</answer>"
    assert last_block(many, "answer") == "Paris"


def test_block_scan_keeps_regex_semantics():
    # nested opening tags belong to the content; a stray closing tag before any opening tag is ignored
    assert first_block("</a> <a>x<a>y</a> z </a>", "a") == "x<a>y"
    assert last_block("<a>1</a><A>2</A> <a>3", "a") == "2"
    assert last_block("<a></a>", "a") == ""
    assert first_block("<ab>x</ab>", "a") is None


@given(st.lists(st.sampled_from(["<a>", "</a>", "<A>", "</A>", "x", " ", "<a", "a>", "\n"]), max_size=12))
def test_block_scan_equals_the_lazy_regex(parts):
    import re

    text = "".join(parts)
    reference = [b.strip() for b in re.findall(r"<a>(.*?)</a>", text, re.IGNORECASE | re.DOTALL)]
    assert first_block(text, "a") == (reference[0] if reference else None)
    assert last_block(text, "a") == (reference[-1] if reference else None)
