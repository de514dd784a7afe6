import pytest

from kbert.config import PRESETS, BertConfig

# Every field differs from its default, so a field dropped in serialization shows.
NON_DEFAULT = dict(
    vocab_size=123,
    hidden_size=48,
    num_layers=3,
    num_heads=4,
    intermediate_size=96,
    max_position_embeddings=64,
    type_vocab_size=3,
    hidden_dropout=0.2,
    attention_dropout=0.3,
    activation="relu",
    layer_norm_epsilon=1e-6,
    initializer_range=0.05,
)


def test_round_trip_dict_and_json(tmp_path):
    config = BertConfig(**NON_DEFAULT)
    assert BertConfig.from_dict(config.to_dict()) == config
    config.to_json(tmp_path / "config.json")
    assert BertConfig.from_json(tmp_path / "config.json") == config


def test_frozen():
    with pytest.raises(Exception):
        BertConfig().hidden_size = 3


def test_small_bert_presets():
    for layers in (2, 4, 6, 8, 10, 12):
        for hidden in (128, 256, 512, 768):
            config = PRESETS[f"bert_l{layers}_h{hidden}"]
            assert (config.num_layers, config.hidden_size) == (layers, hidden)
            assert config.num_heads == hidden // 64
            assert config.intermediate_size == 4 * hidden
    assert PRESETS["bert_base"].num_layers == 12
    assert PRESETS["bert_large"].hidden_size == 1024
    minilm = PRESETS["minilm_l6_h384"]
    assert (minilm.num_layers, minilm.hidden_size, minilm.num_heads) == (6, 384, 12)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(hidden_size=100, num_heads=12), "hidden_size=100 is not divisible by num_heads=12"),
        (dict(vocab_size=0), "vocab_size=0"),
        (dict(hidden_dropout=1.5), "hidden_dropout=1.5"),
        (dict(activation="swish"), "activation='swish'"),
    ],
)
def test_invalid_configs_name_the_values(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        BertConfig(**fields)


def test_sequence_length_check():
    config = BertConfig(max_position_embeddings=512)
    config.check_sequence_length(512)
    with pytest.raises(ValueError, match="sequence_length=600 exceeds max_position_embeddings=512"):
        config.check_sequence_length(600)


def test_unknown_preset_and_fields():
    with pytest.raises(ValueError, match="unknown preset 'bert_huge'"):
        BertConfig.from_preset("bert_huge")
    with pytest.raises(ValueError, match="unknown BertConfig fields"):
        BertConfig.from_dict({"hidden": 3})
