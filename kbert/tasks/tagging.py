"""Tag schemes (IOB1, IOB2, BIOES) and entity figures counted as CoNLL's `conlleval` counts them.

`token-classification` reads and checks its tags with these (`check_scheme`,
`split_tags`, `joined_tag`), scores entities with `entity_metrics`, and its words
with `tagged_accuracy_class` (a Keras metric, defined on first use):
chunks are read from any scheme, ill-formed sequences included, by
conlleval's rules.
"""

import functools

# The target of positions the loss and the metric ignore: [CLS], [SEP],
# padding and every piece of a word (or of a word's part) but its first.
IGNORED = -1
OUTSIDE = "O"
SCHEMES = ("IOB1", "IOB2", "BIOES")
AUTO = "auto"
# The prefixes each scheme's tags may carry ("B-PER", "I-PER", ...).
PREFIXES = {"IOB1": ("B", "I"), "IOB2": ("B", "I"), "BIOES": ("B", "I", "E", "S")}


def parse_scheme(value):
    """`value` as one of `SCHEMES` or `AUTO`, case-insensitive; `ValueError` otherwise."""
    names = {name.lower(): name for name in SCHEMES + (AUTO,)}
    if not isinstance(value, str) or value.lower() not in names:
        raise ValueError(f"tag scheme {value!r} is unknown; expected one of {', '.join(names.values())}")
    return names[value.lower()]


def tag_parts(tag):
    """("B", "PER") for "B-PER", ("O", "") for "O", ("", tag) for anything else."""
    if tag == OUTSIDE:
        return OUTSIDE, ""
    prefix, _, kind = tag.partition("-")
    if len(prefix) != 1 or not kind:
        return "", tag
    return prefix, kind


def detect_scheme(tag_sequences):
    """BIOES if any tag is E- or S-; IOB1 if an I- tag starts an entity; else IOB2."""
    starts_with_inside = False
    for tags in tag_sequences:
        previous = OUTSIDE
        for tag in tags:
            prefix, kind = tag_parts(tag)
            if prefix in ("E", "S"):
                return "BIOES"
            if prefix == "I" and tag_parts(previous)[1] != kind:
                starts_with_inside = True
            previous = tag
    return "IOB1" if starts_with_inside else "IOB2"


def scheme_error(tags, scheme):
    """`(index, reason)` of the first tag that breaks `scheme` in one sentence, or None."""
    allowed = PREFIXES[scheme]
    padded = [OUTSIDE] + list(tags) + [OUTSIDE]
    for index in range(1, len(padded) - 1):
        tag = padded[index]
        prefix, kind = tag_parts(tag)
        if tag == OUTSIDE:
            continue
        if prefix not in allowed:
            return index - 1, f"tag {tag!r} is not a {scheme} tag (O, or {'/'.join(allowed)}-TYPE)"
        before_prefix, before_kind = tag_parts(padded[index - 1])
        after_prefix, after_kind = tag_parts(padded[index + 1])
        inside_before = before_kind == kind and before_prefix in ("B", "I")
        if scheme == "IOB2" and prefix == "I" and not inside_before:
            return index - 1, f"{tag!r} follows {padded[index - 1]!r}; IOB2 starts every entity with B-"
        if scheme == "IOB1" and prefix == "B" and not inside_before:
            return index - 1, (
                f"{tag!r} follows {padded[index - 1]!r}; IOB1 uses B- only right after an entity "
                "of the same type"
            )
        if scheme == "BIOES":
            if prefix in ("I", "E") and not inside_before:
                return index - 1, f"{tag!r} follows {padded[index - 1]!r}; BIOES continues only B- or I-"
            if prefix in ("B", "I") and not (after_kind == kind and after_prefix in ("I", "E")):
                return index - 1, f"{tag!r} is followed by {padded[index + 1]!r}; BIOES ends an entity with E-"
    return None


def check_scheme(examples, scheme, path):
    """Every tag fits `scheme` (detected from the file if AUTO); `ValueError` naming the line."""
    for example in examples:
        for tag, line in zip(example.tags, example.lines):
            if tag != OUTSIDE and tag_parts(tag)[0] not in PREFIXES["BIOES"]:
                raise ValueError(
                    f"{path}, line {line}: tag {tag!r} fits no supported scheme; expected O or "
                    f"B-/I-/E-/S-TYPE ({', '.join(SCHEMES)})"
                )
    if scheme == AUTO:
        scheme = detect_scheme(example.tags for example in examples)
        detected = " (detected)"
    else:
        detected = ""
    for example in examples:
        error = scheme_error(example.tags, scheme)
        if error:
            index, reason = error
            raise ValueError(f"{path}, line {example.lines[index]}: {reason}; scheme {scheme}{detected}")
    return scheme


def split_tags(tag, parts):
    """The tags of a word's `parts` parts: the first begins as the word, the others continue it.

    "B-LOC" in 3 -> B-LOC I-LOC I-LOC; "I-LOC" -> all I-LOC; "O" -> all O;
    in BIOES an entity that ends with the word ends at its last part
    ("S-LOC" -> B-LOC I-LOC E-LOC, "E-LOC" -> I-LOC I-LOC E-LOC), so that
    the parts follow the scheme and `joined_tag` gives the word's tag back.
    """
    prefix, kind = tag_parts(tag)
    if parts == 1 or tag == OUTSIDE:
        return [tag] * parts
    begins, ends = prefix in ("B", "S"), prefix in ("E", "S")
    first = ("B" if begins else "I") + "-" + kind
    return [first] + [f"I-{kind}"] * (parts - 2) + [("E" if ends else "I") + "-" + kind]


def joined_tag(first, last):
    """A BIOES word's tag from the tags of its first and last parts (`split_tags` undone).

    The first part gives the type and whether the word begins an entity; the
    word ends it unless its last part continues it (B- or I- of that type).
    """
    prefix, kind = tag_parts(first)
    if first == OUTSIDE or prefix not in PREFIXES["BIOES"]:
        return first
    last_prefix, last_kind = tag_parts(last)
    begins = prefix in ("B", "S")
    ends = not (last_prefix in ("B", "I") and last_kind == kind)
    return {(True, True): "S", (True, False): "B", (False, True): "E", (False, False): "I"}[
        begins, ends
    ] + "-" + kind


# === Entities and their figures ===


def chunks(tags):
    """The entities of one tag sequence, `(type, first, past_last)` word indices.

    conlleval's chunk rules (its `startOfChunk` and `endOfChunk`), so every
    scheme and ill-formed sequences are read as CoNLL's scorer reads them: an
    I- after O or after another type starts an entity, and an entity ends at
    O, at B- or S-, after E- or S-, or where the type changes.
    """
    found = []
    previous, previous_kind, begin = OUTSIDE, "", 0
    for index, tag in enumerate(list(tags) + [OUTSIDE]):
        prefix, kind = tag_parts(tag)
        if _ends(previous, prefix, previous_kind, kind):
            found.append((previous_kind, begin, index))
        if _starts(previous, prefix, previous_kind, kind):
            begin = index
        previous, previous_kind = prefix, kind
    return found


def _ends(previous, prefix, previous_kind, kind):
    return (
        previous in ("E", "S")
        or (previous in ("B", "I") and prefix in ("B", "S", OUTSIDE))
        or (previous != OUTSIDE and previous_kind != kind)
    )


def _starts(previous, prefix, previous_kind, kind):
    return (
        prefix in ("B", "S")
        or (previous in ("E", "S", OUTSIDE) and prefix in ("E", "I"))
        or (prefix != OUTSIDE and previous_kind != kind)
    )


def entity_metrics(gold, predicted):
    """Entity-level micro `precision`, `recall`, `f1`, `per_type` figures and word `accuracy`.

    Args:
        gold, predicted: lists of tag sequences, one per sentence.

    Returns:
        dict. As conlleval and seqeval's default mode count them: an entity
        is correct when its type and both boundaries are; a ratio with a zero
        denominator is 0.
    """
    counts = {}
    correct_words = total_words = 0
    for gold_tags, predicted_tags in zip(gold, predicted, strict=True):
        if len(gold_tags) != len(predicted_tags):
            raise ValueError(f"{len(predicted_tags)} predicted tags for {len(gold_tags)} words")
        gold_chunks, predicted_chunks = set(chunks(gold_tags)), set(chunks(predicted_tags))
        found = {"gold": gold_chunks, "predicted": predicted_chunks, "correct": gold_chunks & predicted_chunks}
        for key, entities in found.items():
            for kind, _, _ in entities:
                counts.setdefault(kind, {"gold": 0, "predicted": 0, "correct": 0})[key] += 1
        correct_words += sum(a == b for a, b in zip(gold_tags, predicted_tags))
        total_words += len(gold_tags)
    total = {key: sum(c[key] for c in counts.values()) for key in ("gold", "predicted", "correct")}
    per_type = {kind: _figures(counts[kind]) for kind in sorted(counts)}
    return {
        **{k: v for k, v in _figures(total).items() if k != "support"},
        "accuracy": correct_words / total_words if total_words else 0.0,
        "entities": total["gold"],
        "predicted_entities": total["predicted"],
        "per_type": per_type,
    }


def _figures(count):
    precision = count["correct"] / count["predicted"] if count["predicted"] else 0.0
    recall = count["correct"] / count["gold"] if count["gold"] else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "support": count["gold"]}


def scheme_of_tags(tags, scheme=AUTO):
    """`scheme` (IOB1, IOB2, BIOES, any case) or, for "auto", the scheme of the tag names
    `tags`: BIOES with E- or S- tags; IOB1 if a type has I- but no B- tag (IOB2
    begins every entity with B-); else IOB2.

    `detect_scheme` reads tag sequences: the tags of each type side by side,
    B- before I-, are read as one.
    """
    scheme = parse_scheme(scheme)
    if scheme != AUTO:
        return scheme
    if not (isinstance(tags, list) and all(isinstance(tag, str) for tag in tags)):
        tags = []  # the task's constructor names what is wrong with them
    return detect_scheme([sorted(tags, key=lambda tag: tag_parts(tag)[::-1])])


@functools.lru_cache(maxsize=None)
def tagged_accuracy_class():
    """`TaggedAccuracy`, a Keras metric: accuracy over the positions whose target is
    not `IGNORED` (each word's first piece). Defined on first use, so that
    listing the tasks does not import Keras."""
    import keras
    from keras import ops

    @keras.saving.register_keras_serializable(package="kbert")
    class TaggedAccuracy(keras.metrics.Mean):
        def update_state(self, y_true, y_pred, sample_weight=None):
            y_true = ops.cast(y_true, "int32")
            predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
            correct = ops.cast(ops.equal(predicted, y_true), "float32")
            weight = ops.cast(ops.not_equal(y_true, IGNORED), "float32")
            if sample_weight is not None:
                weight = weight * ops.cast(sample_weight, "float32")
            return super().update_state(correct, sample_weight=weight)

    return TaggedAccuracy
