"""kbert.tasks.task_config: one declaration gives the flags, the parsing, what is stored and the merge."""

import dataclasses

import pytest

from kbert.tasks.task_config import TaskConfig, learned, option


@dataclasses.dataclass(frozen=True)
class Config(TaskConfig):
    labels: list = learned("class names", required=True)
    column: str = option("column holding the text", "text")
    stride: int = option("window stride", 128)
    threshold: float = option("null threshold")
    lower: bool = option("lowercase", True)
    head: str = option("the head", "wide", ("wide", "narrow"), former="narrow", built=True)


def test_flags_parsing_and_refusals():
    assert [o.name for o in Config.flags()] == ["column", "stride", "threshold", "lower", "head"]
    assert Config.flags()[1].default == 128 and Config.flags()[4].choices == ("wide", "narrow")
    config = Config.create({"labels": ["a", "b"], "stride": "64", "threshold": "-1.5", "lower": "no"})
    assert (config.stride, config.threshold, config.lower, config.head) == (64, -1.5, False, "wide")
    for values, message in [
        ({"labels": ["a"], "stride": "6.5"}, "stride='6.5'; expected an integer"),
        ({"labels": ["a"], "threshold": "nan"}, "threshold=nan; expected a finite number"),
        ({"labels": ["a"], "lower": "maybe"}, "lower='maybe'; expected true or false"),
        ({"labels": ["a"], "head": "deep"}, "head='deep'; expected one of wide, narrow"),
        ({"labels": ["a"], "colour": "red"}, "the task takes no colour=; it takes labels, column"),
        ({"column": "x"}, "the task needs labels="),
    ]:
        with pytest.raises(ValueError, match=message):
            Config.create(values)


def test_stored_values_and_the_merge():
    stored = Config.create(Config.with_formers({"labels": ["a", "b"]}))  # written before `head` existed
    assert stored.head == "narrow" and stored.to_dict()["column"] == "text"
    merged = stored.merged({"column": "body", "stride": None, "other_task_flag": "x"}, trained=True)
    assert (merged.column, merged.stride) == ("body", 128)
    assert stored.merged({"head": "narrow"}, trained=True) == stored
    with pytest.raises(ValueError, match="--head 'wide': this model has head 'narrow'; it is chosen when training"):
        stored.merged({"head": "wide"}, trained=True)
    assert stored.merged({"head": "wide"}, trained=False).head == "wide"
