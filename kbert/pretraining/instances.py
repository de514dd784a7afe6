"""Masked-LM / next-sentence training instances, as google-research/bert makes them.

A port of `create_pretraining_data.py` (create_training_instances,
create_instances_from_document, truncate_seq_pair,
create_masked_lm_predictions) that works on token ids instead of token strings.
It draws from one `random.Random` in the same order as the original, so the
same documents and seed give the same instances. Pure Python: no TensorFlow.
"""

import collections
import dataclasses

# google-research/bert's flag defaults (create_pretraining_data.py).
DEFAULT_MAX_SEQ_LENGTH = 128
DEFAULT_MAX_PREDICTIONS_PER_SEQ = 20
DEFAULT_MASKED_LM_PROB = 0.15
DEFAULT_DUPE_FACTOR = 10
DEFAULT_SHORT_SEQ_PROB = 0.1
DEFAULT_RANDOM_SEED = 12345
# The BERT paper's replacement of a selected token: 80% [MASK], then half of
# the remaining 20% kept as is and half replaced by a random vocabulary entry.
MASK_TOKEN_RATE = 0.8
KEEP_GIVEN_NOT_MASK_RATE = 0.5
# The BERT paper's next-sentence task: B is a random sentence half the time.
RANDOM_NEXT_RATE = 0.5
# Attempts to draw a random document other than the current one.
RANDOM_DOCUMENT_TRIES = 10

TrainingInstance = collections.namedtuple(
    "TrainingInstance",
    ["tokens", "segment_ids", "masked_lm_positions", "masked_lm_labels", "is_random_next"],
)


@dataclasses.dataclass(frozen=True)
class InstanceOptions:
    """How sentence pairs are cut and masked (google-research/bert's flags).

    Args:
        max_seq_length: int. Length of every instance, [CLS] and 2×[SEP] included.
        max_predictions_per_seq: int. Most masked positions per instance.
        masked_lm_prob: float. Share of the tokens to predict.
        dupe_factor: int. Passes over the corpus, each with fresh masks and pairs.
        short_seq_prob: float. Probability of a shorter target length, to
            narrow the gap with short fine-tuning inputs.
        whole_word_masking: bool. Mask all word pieces of a word together.
    """

    max_seq_length: int = DEFAULT_MAX_SEQ_LENGTH
    max_predictions_per_seq: int = DEFAULT_MAX_PREDICTIONS_PER_SEQ
    masked_lm_prob: float = DEFAULT_MASKED_LM_PROB
    dupe_factor: int = DEFAULT_DUPE_FACTOR
    short_seq_prob: float = DEFAULT_SHORT_SEQ_PROB
    whole_word_masking: bool = False

    def __post_init__(self):
        # [CLS] A [SEP] B [SEP] needs at least one token in A and in B.
        if not isinstance(self.max_seq_length, int) or self.max_seq_length < 5:
            raise ValueError(f"max_seq_length={self.max_seq_length!r} must be an integer >= 5")
        if not isinstance(self.max_predictions_per_seq, int) or self.max_predictions_per_seq < 1:
            raise ValueError(
                f"max_predictions_per_seq={self.max_predictions_per_seq!r} must be a "
                "positive integer"
            )
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"masked_lm_prob={self.masked_lm_prob!r} must be in (0, 1)")
        if not isinstance(self.dupe_factor, int) or self.dupe_factor < 1:
            raise ValueError(f"dupe_factor={self.dupe_factor!r} must be a positive integer")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob={self.short_seq_prob!r} must be in [0, 1]")


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """The ids the algorithm needs from a vocabulary.

    Args:
        vocab_size: int. Random replacements are drawn from `[0, vocab_size)`,
            special tokens included, as in the original.
        cls_id, sep_id, mask_id: int.
        continuation: tuple of bool, one per id: True for "##" word pieces
            (only read with whole-word masking).
    """

    vocab_size: int
    cls_id: int
    sep_id: int
    mask_id: int
    continuation: tuple = ()

    @classmethod
    def from_vocabulary(cls, vocabulary):
        """Reads the ids of "[CLS]", "[SEP]", "[MASK]" and the "##" pieces."""
        index = {token: i for i, token in enumerate(vocabulary)}
        missing = [token for token in ("[CLS]", "[SEP]", "[MASK]") if token not in index]
        if missing:
            raise ValueError(f"the vocabulary lacks the special tokens {missing}")
        return cls(
            vocab_size=len(vocabulary),
            cls_id=index["[CLS]"],
            sep_id=index["[SEP]"],
            mask_id=index["[MASK]"],
            continuation=tuple(token.startswith("##") for token in vocabulary),
        )


def create_training_instances(documents, options, special_ids, rng):
    """All instances of a corpus, `options.dupe_factor` times over, shuffled.

    Args:
        documents: list of documents, each a list of sentences, each a list
            of token ids. Empty documents are dropped.
        options: `InstanceOptions`.
        special_ids: `SpecialIds`.
        rng: `random.Random`. The only source of randomness.

    Returns:
        A list of `TrainingInstance`s with token ids (masked) as `tokens`.
    """
    documents = [document for document in documents if document]
    rng.shuffle(documents)
    instances = []
    for _ in range(options.dupe_factor):
        for document_index in range(len(documents)):
            instances.extend(
                create_instances_from_document(documents, document_index, options, special_ids, rng)
            )
    rng.shuffle(instances)
    return instances


def create_instances_from_document(all_documents, document_index, options, special_ids, rng):
    """Cuts one document into sentence pairs (A, B), B a random next half the time."""
    document = all_documents[document_index]
    # Room for [CLS], [SEP], [SEP].
    max_num_tokens = options.max_seq_length - 3
    # Mostly fill the sequence, since it is padded to max_seq_length anyway;
    # sometimes aim shorter so the model also sees short inputs.
    target_seq_length = max_num_tokens
    if rng.random() < options.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    # Segments follow the sentence boundaries of the input: cutting anywhere
    # would make next-sentence prediction too easy.
    instances = []
    current_chunk = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                # How many sentences of the chunk go into A.
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])

                tokens_b = []
                if len(current_chunk) == 1 or rng.random() < RANDOM_NEXT_RATE:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(RANDOM_DOCUMENT_TRIES):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    # The chunk's unused sentences are put back for the next pair.
                    i -= len(current_chunk) - a_end
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                if not tokens_a or not tokens_b:
                    raise AssertionError("an instance segment is empty after truncation")

                cls_id, sep_id = special_ids.cls_id, special_ids.sep_id
                tokens = [cls_id, *tokens_a, sep_id, *tokens_b, sep_id]
                segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                tokens, positions, labels = create_masked_lm_predictions(
                    tokens, options, special_ids, rng
                )
                instances.append(
                    TrainingInstance(tokens, segment_ids, positions, labels, is_random_next)
                )
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def create_masked_lm_predictions(tokens, options, special_ids, rng):
    """Chooses the positions to predict and replaces them 80/10/10.

    Returns `(masked tokens, sorted positions, original ids at those positions)`.
    With whole-word masking a "##" piece joins the candidate before it, and a
    word is skipped if it would overflow the prediction budget; the 80/10/10
    choice is still drawn per piece, as in the original.
    """
    candidates = []
    for i, token in enumerate(tokens):
        if token == special_ids.cls_id or token == special_ids.sep_id:
            continue
        if options.whole_word_masking and candidates and special_ids.continuation[token]:
            candidates[-1].append(i)
        else:
            candidates.append([i])
    rng.shuffle(candidates)

    output_tokens = list(tokens)
    num_to_predict = min(
        options.max_predictions_per_seq,
        max(1, int(round(len(tokens) * options.masked_lm_prob))),
    )
    masked = []
    covered = set()
    for index_set in candidates:
        if len(masked) >= num_to_predict:
            break
        if len(masked) + len(index_set) > num_to_predict:
            continue
        if any(index in covered for index in index_set):
            continue
        for index in index_set:
            covered.add(index)
            if rng.random() < MASK_TOKEN_RATE:
                replacement = special_ids.mask_id
            elif rng.random() < KEEP_GIVEN_NOT_MASK_RATE:
                replacement = tokens[index]
            else:
                replacement = rng.randint(0, special_ids.vocab_size - 1)
            output_tokens[index] = replacement
            masked.append((index, tokens[index]))
    masked.sort()
    return output_tokens, [index for index, _ in masked], [label for _, label in masked]


def truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    """Trims the longer of A and B, from the front or the back at random, in place."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()
