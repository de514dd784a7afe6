"""`token-classification`'s rows: words in windows of pieces, each word's tag at its first piece.

`TokenClassification.encode` and `training_rows` pack their rows here:
`encode_words` packs each example (a sentence, or a document's sentences
joined by `joined`) in windows (`kbert.tasks.word_windows`), and says in
`Encoded.extra` where each word's first piece went; `joined_rows` does so
for groups of sentences read as one (`documents`). `tag_ids` gives every
word's tag id, naming the file and line of a tag the model does not know.
"""

import numpy as np

from kbert.config import ENCODER_INPUTS
from kbert.tasks.base import ENCODE_CHUNK
from kbert.tasks.records import Encoded, WordsExample
from kbert.tasks.tagging import IGNORED, split_tags
from kbert.tasks.word_windows import word_part_ids


def encode_words(task, examples, targets=True):
    """Windows of each example's pieces; `extra` says where each word's first piece went.

    Each word is cut into parts (`word_part_ids`: with the task's `word_split`
    "raw", the words raw text would give; else the word itself). Every
    part's first piece is trained on its tag (`split_tags`), which is the
    word's own for its first part; its other pieces are `IGNORED`.

    `extra` holds int arrays over all words of all examples, in order:
    `word_row` and `word_position` (the row and position of its first
    piece, where its tag is read), `word_end_row` and `word_end_position`
    (those of its last part's first piece, where BIOES reads whether it
    ends an entity), `word_parts` (its number of parts) and `word_splits`
    (example i's words are `word_splits[i]:word_splits[i + 1]`).
    """
    begins = range(0, len(examples), ENCODE_CHUNK)
    windowed, parts_of_word = [], []
    for begin in begins:
        part_ids, counts = word_part_ids(task.tokenizer, examples[begin : begin + ENCODE_CHUNK], task.word_split)
        windowed.append({key: value.numpy() for key, value in task.windows(part_ids).items()})
        parts_of_word.append(counts)
    first_row = np.cumsum([0] + [len(part["example_of_row"]) for part in windowed])
    features = {
        name: np.concatenate([part[name] for part in windowed]).astype(np.int32)
        for name in ENCODER_INPUTS
    }
    part_row = np.concatenate([part["word_row"] + row for part, row in zip(windowed, first_row)])
    part_position = np.concatenate([part["word_position"] for part in windowed])
    counts = np.concatenate(parts_of_word)
    first = np.cumsum(counts) - counts
    last = first + counts - 1
    extra = {
        "word_row": part_row[first],
        "word_position": part_position[first],
        "word_end_row": part_row[last],
        "word_end_position": part_position[last],
        "word_parts": counts,
        "word_splits": np.cumsum([0] + [len(example.words) for example in examples]),
    }
    example_of_row = np.concatenate([part["example_of_row"] + b for part, b in zip(windowed, begins)])
    target = None
    if targets:
        target = np.full(features["token_ids"].shape, IGNORED, np.int32)
        target[part_row, part_position] = part_tag_ids(task, examples, counts)
    return Encoded(features, target, example_of_row, extra)


def joined_rows(task, examples, groups, targets):
    """`encode_words` of each group of `examples` (slices) joined into one; a row's
    example is that of the first word read from it (or after it)."""
    encoded = encode_words(task, [joined(examples[group]) for group in groups], targets)
    sentence_of_word = np.concatenate([
        np.repeat(np.arange(group.start, group.stop), [len(example.words) for example in examples[group]])
        for group in groups
    ])
    first_word = np.full(len(encoded), len(sentence_of_word) - 1)
    np.minimum.at(first_word, encoded.extra["word_row"], np.arange(len(sentence_of_word)))
    encoded.example_of_row = sentence_of_word[np.minimum.accumulate(first_word[::-1])[::-1]]
    return encoded


def part_tag_ids(task, examples, counts):
    """The tag id of every part of every word (`split_tags`), in order.

    A word whose parts would need a tag the training data never had
    (`I-X` where X only ever tagged single tokens) is trained on its first
    part only, as with `word_split` "none".
    """
    word_ids = task.tag_ids(examples)
    index = {tag: i for i, tag in enumerate(task.tags)}
    ids = np.repeat(word_ids, counts)
    first = np.cumsum(counts) - counts
    tags = [tag for example in examples for tag in example.tags]
    for word in np.flatnonzero(counts > 1):
        split = [index.get(tag) for tag in split_tags(tags[word], int(counts[word]))]
        if None in split:
            split = [word_ids[word]] + [IGNORED] * (len(split) - 1)
        ids[first[word] : first[word] + counts[word]] = split
    return ids


def documents(examples):
    """Slices of `examples`: each run of consecutive examples of one `document`, and each example without one."""
    groups, begin = [], 0
    for i in range(1, len(examples) + 1):
        if i == len(examples) or examples[i].document is None or examples[i].document != examples[begin].document:
            groups.append(slice(begin, i))
            begin = i
    return groups


def joined(examples):
    """One `WordsExample` of `examples`' words (and tags and lines) in order."""
    if len(examples) == 1:
        return examples[0]
    tags = None if examples[0].tags is None else [tag for example in examples for tag in example.tags]
    lines = None if examples[0].lines is None else [line for example in examples for line in example.lines]
    return WordsExample(
        words=[word for example in examples for word in example.words], tags=tags, lines=lines,
        line=examples[0].line, document=examples[0].document,
    )


def tag_ids(tags, examples, source, index=None):
    """int32 index in `tags` (`index`: tag -> index, if built) of every word's tag
    of `examples`, concatenated; `ValueError` naming `source`, the line and the tag
    of the first unknown one."""
    index = index or {tag: i for i, tag in enumerate(tags)}
    ids = []
    for example in examples:
        for tag, line in zip(example.tags, example.lines):
            if tag not in index:
                raise ValueError(
                    f"{source}, line {line}: tag {tag!r} was not in the training data; the model knows {tags}"
                )
            ids.append(index[tag])
    return np.asarray(ids, np.int32)
